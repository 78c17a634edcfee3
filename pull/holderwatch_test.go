package pull

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/errcode"
	"github.com/connex/connex/transport"
)

// TestHolderWatchLeft: a holder's departure cancels exactly the pulls that
// read from it, with a cause that maps to peer_unavailable; unwatched pulls
// and pulls from other members are untouched.
func TestHolderWatchLeft(t *testing.T) {
	var w HolderWatch
	a1, c1 := context.WithCancelCause(context.Background())
	a2, c2 := context.WithCancelCause(context.Background())
	b1, cb := context.WithCancelCause(context.Background())
	done, cd := context.WithCancelCause(context.Background())
	defer c1(nil)
	defer c2(nil)
	defer cb(nil)
	defer cd(nil)
	w.Watch("h1", c1)
	w.Watch("h1", c2)
	w.Watch("h2", cb)
	unwatch, _ := w.Watch("h1", cd)
	unwatch()
	unwatch() // idempotent
	if n := w.Running(); n != 3 {
		t.Fatalf("running %d, want 3", n)
	}
	if n := w.Left("h1", "unreachable"); n != 2 {
		t.Fatalf("Left cancelled %d pulls, want 2", n)
	}
	for i, ctx := range []context.Context{a1, a2} {
		gone := holderLeft(ctx)
		if gone == nil {
			t.Fatalf("pull %d: not cancelled with the holder's departure: %v", i, context.Cause(ctx))
		}
		if !errors.Is(gone, transport.ErrPeerGone) || errcode.Of(gone) != api.CodePeerUnavailable {
			t.Fatalf("pull %d: cause %v maps to %d", i, gone, errcode.Of(gone))
		}
		if want := "holder member h1 left the cluster (unreachable)"; gone.Error() != want {
			t.Fatalf("pull %d: %q, want %q", i, gone, want)
		}
	}
	if b1.Err() != nil || done.Err() != nil {
		t.Fatalf("other pulls cancelled: h2 %v, unwatched %v", b1.Err(), done.Err())
	}
	if n := w.Running(); n != 1 {
		t.Fatalf("running %d after Left, want 1", n)
	}
	if n := w.Left("h1", "timeout"); n != 0 {
		t.Fatalf("second Left cancelled %d", n)
	}
	var nilWatch *HolderWatch
	unwatchNil, bindNil := nilWatch.Watch("h1", c1)
	unwatchNil()
	bindNil("x")
	if nilWatch.Left("h1", "x") != 0 || nilWatch.Running() != 0 {
		t.Fatal("a nil HolderWatch must watch nothing")
	}
}

// TestHolderWatchIncarnations: a departure of one incarnation of a holder
// (its cluster id) ends the pulls that incarnation serves and those not
// bound yet, never those the holder's next incarnation serves: a stale
// report of the member evicted before its rejoin fails no healthy pull.
func TestHolderWatchIncarnations(t *testing.T) {
	var w HolderWatch
	old, cOld := context.WithCancelCause(context.Background())
	cur, cCur := context.WithCancelCause(context.Background())
	unbound, cUnbound := context.WithCancelCause(context.Background())
	defer cOld(nil)
	defer cCur(nil)
	defer cUnbound(nil)
	_, bindOld := w.Watch("h1", cOld)
	_, bindCur := w.Watch("h1", cCur)
	w.Watch("h1", cUnbound)
	bindOld("id-1")
	bindCur("id-2")
	if n := w.LeftIncarnation("h1", "id-1", "unreachable"); n != 2 {
		t.Fatalf("the old incarnation's departure ended %d pulls, want 2 (its own and the unbound one)", n)
	}
	if holderLeft(old) == nil || holderLeft(unbound) == nil {
		t.Fatalf("old %v, unbound %v: want both ended", context.Cause(old), context.Cause(unbound))
	}
	if cur.Err() != nil {
		t.Fatalf("a pull served by the rejoined incarnation ended on the old one's departure: %v", context.Cause(cur))
	}
	if n := w.LeftIncarnation("h1", "id-2", "timeout"); n != 1 || holderLeft(cur) == nil {
		t.Fatalf("the current incarnation's departure ended %d pulls (%v), want 1", n, context.Cause(cur))
	}
}

// TestReadErrPrefersHolderLeft: once the holder's departure cancelled a
// pull, its steps report that (peer_unavailable), not the bare
// cancellation (transfer_failed) the data plane or NATS client returns.
func TestReadErrPrefersHolderLeft(t *testing.T) {
	var w HolderWatch
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	w.Watch("h", cancel)
	w.Left("h", "timeout")
	err := descriptorsErr("p1", "h", holderLeft(ctx), fmt.Errorf("api: peer.descriptors on member h: %w", context.Canceled))
	if errcode.Of(err) != api.CodePeerUnavailable {
		t.Fatalf("code %d: %v", errcode.Of(err), err)
	}
	if got := readErr(ctx, transport.ErrCanceled); errcode.Of(got) != api.CodePeerUnavailable {
		t.Fatalf("read: code %d: %v", errcode.Of(got), got)
	}
	// Shutdown (a plain cancel of the parent) stays transfer_failed.
	parent, stop := context.WithCancel(context.Background())
	child, cc := context.WithCancelCause(parent)
	defer cc(nil)
	stop()
	if got := readErr(child, child.Err()); errcode.Of(got) != api.CodeTransferFailed {
		t.Fatalf("shutdown: code %d: %v", errcode.Of(got), got)
	}
}

// blockingEndpoint's Get reports that it started, then waits for ctx (a
// holder that is gone without the data plane noticing, as over UCX's
// shared-memory lanes).
type blockingEndpoint struct{ started chan struct{} }

func (e *blockingEndpoint) Get(ctx context.Context, _ []transport.GetOp) error {
	select {
	case e.started <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return transport.CtxErr(ctx.Err())
}

func (e *blockingEndpoint) GetProgress(ctx context.Context, ops []transport.GetOp, progress func(int)) error {
	return transport.ProgressAtEnd(ctx, ops, progress, e.Get)
}

func (e *blockingEndpoint) GetStrided(ctx context.Context, ops []transport.StridedOp) error {
	return e.Get(ctx, transport.Pieces(ops))
}

func (e *blockingEndpoint) GetStridedProgress(ctx context.Context, ops []transport.StridedOp, progress func(int)) error {
	return transport.StridedProgressAtEnd(ctx, ops, progress, e.GetStrided)
}

func (e *blockingEndpoint) Close() error { return nil }

// funcEndpoint's Get calls the function itself.
type funcEndpoint func(ctx context.Context, ops []transport.GetOp) error

func (f funcEndpoint) Get(ctx context.Context, ops []transport.GetOp) error { return f(ctx, ops) }
func (f funcEndpoint) Close() error                                         { return nil }

func (f funcEndpoint) GetProgress(ctx context.Context, ops []transport.GetOp, progress func(int)) error {
	return transport.ProgressAtEnd(ctx, ops, progress, f)
}

func (f funcEndpoint) GetStrided(ctx context.Context, ops []transport.StridedOp) error {
	return f(ctx, transport.Pieces(ops))
}

func (f funcEndpoint) GetStridedProgress(ctx context.Context, ops []transport.StridedOp, progress func(int)) error {
	return transport.StridedProgressAtEnd(ctx, ops, progress, f.GetStrided)
}

func testOps(n int) ([]transport.GetOp, uint64) {
	ops := make([]transport.GetOp, n)
	for i := range ops {
		ops[i] = transport.GetOp{RemoteAddr: uint64(i), Dst: make([]byte, 1)}
	}
	return ops, uint64(n)
}

// TestReadsEndWhenHolderLeaves: reads blocked on a silent data plane end as
// soon as membership reports the holder gone, long before the stall
// deadline, with peer_unavailable naming the holder.
func TestReadsEndWhenHolderLeaves(t *testing.T) {
	deps := &PullDeps{Holders: &HolderWatch{}}
	a := &puller{deps: deps, p: &Pull{ID: "p1", Stall: time.Hour}}
	ctx, end, _ := deps.watchHolder(context.Background(), "h1")
	defer end()
	ep := &blockingEndpoint{started: make(chan struct{}, 1)}
	ops, total := testOps(3)
	errc := make(chan error, 1)
	go func() { errc <- a.readBatches(ctx, ep, transport.Caps{}, ops, total, "h1") }()
	select {
	case <-ep.started:
	case <-time.After(10 * time.Second):
		t.Fatal("no Get started")
	}
	if n := deps.Holders.Left("h1", "unreachable"); n != 1 {
		t.Fatalf("Left cancelled %d pulls, want 1", n)
	}
	select {
	case err := <-errc:
		if errcode.Of(err) != api.CodePeerUnavailable || !strings.Contains(err.Error(), "holder member h1 left the cluster (unreachable)") {
			t.Fatalf("code %d: %v", errcode.Of(err), err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("reads still running 10 s after the holder left (stall deadline is 1 h)")
	}
	end()
	if n := deps.Holders.Running(); n != 0 {
		t.Fatalf("%d pulls still watched after end", n)
	}
}

// TestReadsCompleteDespiteLateDeparture: a departure that lands as the last
// Get returns successfully does not turn a complete pull into a failure.
func TestReadsCompleteDespiteLateDeparture(t *testing.T) {
	deps := &PullDeps{Holders: &HolderWatch{}}
	a := &puller{deps: deps, p: &Pull{ID: "p1", Stall: time.Hour}}
	ctx, end, _ := deps.watchHolder(context.Background(), "h1")
	defer end()
	ops, total := testOps(batchOps + 1) // two batches
	var calls atomic.Int32
	ep := funcEndpoint(func(ctx context.Context, ops []transport.GetOp) error {
		if calls.Add(1) == 2 {
			deps.Holders.Left("h1", "leave")
		}
		return nil
	})
	if err := a.readBatches(ctx, ep, transport.Caps{}, ops, total, "h1"); err != nil {
		t.Fatalf("complete pull failed: %v", err)
	}
	if calls.Load() != 2 {
		t.Fatalf("%d Gets, want 2", calls.Load())
	}
}
