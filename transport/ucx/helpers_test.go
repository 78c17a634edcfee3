//go:build ucx && cgo

package ucx

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/transport"

	"github.com/connex/connex/harness/poll"
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
	return poll.Wait(total, every, cond)
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

// pulled is what pullOnce set up: a holder h with src registered as reg, and
// reader r's endpoint ep to it; op is one GET of all of reg into dst.
type pulled struct {
	h, r     *Backend
	src, dst []byte
	reg      transport.Registration
	ep       transport.Endpoint
	op       []transport.GetOp
}

// pullOnce opens a holder and a reader (tls as for openT), registers n
// seeded random bytes on the holder, connects the reader and runs op once
// (5s deadline), failing the test on any error. The bytes are not compared.
func pullOnce(t testing.TB, tls string, n int, seed uint64) pulled {
	t.Helper()
	p := pulled{h: openT(t, tls), r: openT(t, tls), src: randBytes(n, seed)}
	var err error
	if p.reg, err = p.h.Register(p.src); err != nil {
		t.Fatal(err)
	}
	p.ep = connectT(t, p.r, p.h)
	p.dst = make([]byte, len(p.src))
	p.op = []transport.GetOp{{RemoteKey: p.reg.RemoteKey(), RemoteAddr: p.reg.RemoteAddr(), Dst: p.dst}}
	if err := getT(p.ep, 5*time.Second, p.op); err != nil {
		t.Fatal(err)
	}
	return p
}

// pullFromKilled pulls ops over ep, each pull with deadline, up to tries
// times until one fails (with inGet, when not nil, true during each pull),
// logs that failure under label, and fails the test unless it is
// ErrPeerGone or ErrTimeout. The endpoint stays usable as an object: a
// next pull must fail too and end with its deadline, and Close must not
// hang.
func pullFromKilled(t testing.TB, ep transport.Endpoint, ops []transport.GetOp, deadline time.Duration, tries int, inGet *atomic.Bool, label string) {
	t.Helper()
	var err error
	var took time.Duration
	for i := 0; i < tries && err == nil; i++ {
		if inGet != nil {
			inGet.Store(true)
		}
		took, err = getWithin(t, ep, deadline, ops)
		if inGet != nil {
			inGet.Store(false)
		}
	}
	t.Logf("%s: %v after %v", label, err, took)
	if !errors.Is(err, transport.ErrPeerGone) && !errors.Is(err, transport.ErrTimeout) {
		t.Fatalf("got %v, want ErrPeerGone or ErrTimeout", err)
	}
	took, err = getWithin(t, ep, 300*time.Millisecond, ops)
	t.Logf("next pull: %v after %v", err, took)
	if err == nil {
		t.Fatal("pull from a dead holder succeeded")
	}
}
