// Package poll waits in tests for a condition instead of sleeping for a
// guessed time (nats-server's checkFor): the condition is asked again every
// interval until it holds or the deadline passes, which fails the test with
// the condition's last answer. The deadline guards against a hang; it is no
// claim about speed (benchmarks measure that).
package poll

import (
	"testing"
	"time"
)

// Until calls cond every `every` until it returns nil, or fails t with
// cond's last error once total has passed.
func Until(t testing.TB, total, every time.Duration, cond func() error) {
	t.Helper()
	var err error
	if !Wait(total, every, func() bool { err = cond(); return err == nil }) {
		t.Fatalf("condition not met within %v: %v", total, err)
	}
}

// Wait calls cond every `every` until it returns true, for at most total,
// and reports whether it did. Unlike Until it never touches a testing.TB,
// so goroutines other than the test's may use it.
func Wait(total, every time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(total); !cond(); time.Sleep(every) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}
