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
	deadline := time.Now().Add(total)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v: %v", total, err)
			return // a TB whose Fatalf returns (a recorder) must not spin
		}
		time.Sleep(every)
	}
}
