//go:build ucx && cgo

package ucx

import (
	"context"
	"testing"
	"time"

	"github.com/connex/connex/transport"

	"github.com/connex/connex/poll"
)

// hangGuard is how long a test waits, after a Get's context ended, before
// it calls the Get hung. It is far above any deadline the tests set: they
// assert that a Get ends with its context and how, not how soon after (a
// loaded machine delays that by a varying amount); the overshoot is
// BenchmarkGetPastDeadline's figure.
const hangGuard = 10 * time.Second

// checkFor polls fn until it returns nil; poll.Until fails the test with
// fn's last error once total has passed.
func checkFor(t testing.TB, total, every time.Duration, fn func() error) {
	t.Helper()
	poll.Until(t, total, every, fn)
}

// waitUntil polls cond every `every` for at most total and reports whether
// it held: checkFor for goroutines other than the test's, which must not
// call t.Fatal.
func waitUntil(total, every time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(total); !cond(); time.Sleep(every) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// getEnds runs ep.Get(ctx, ops) and returns how long it took and its
// error. A Get must end when ctx does: one still running hangGuard after
// that fails the test.
func getEnds(t testing.TB, ctx context.Context, ep transport.Endpoint, ops []transport.GetOp) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- ep.Get(ctx, ops) }()
	select {
	case err := <-done:
		return time.Since(start), err
	case <-ctx.Done():
	}
	select {
	case err := <-done:
		return time.Since(start), err
	case <-time.After(hangGuard):
		t.Fatalf("Get still running %v after its context ended (%v)", hangGuard, ctx.Err())
		return 0, nil
	}
}

// getWithin is getEnds with a deadline d.
func getWithin(t testing.TB, ep transport.Endpoint, d time.Duration, ops []transport.GetOp) (time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return getEnds(t, ctx, ep, ops)
}

// postedBatches is the number of Get batches b has posted to UCX and not
// yet completed: nonzero while a Get waits for the holder.
func postedBatches(b *Backend) int {
	var n int
	if err := b.w.call(func() { n = len(b.w.active) }); err != nil {
		return 0
	}
	return n
}

// forcedDeregs is the number of b's deregistrations whose replies outlived
// DeregisterGrace (their endpoints were force-closed).
func forcedDeregs(b *Backend) int {
	var n int
	if err := b.w.call(func() { n = b.w.forcedDeregs }); err != nil {
		return 0
	}
	return n
}
