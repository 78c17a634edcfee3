package actors

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/connex/connex/api"
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
	unwatch := w.Watch("h1", cd)
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
		if !errors.Is(gone, transport.ErrPeerGone) || api.CodeOf(gone) != api.CodePeerUnavailable {
			t.Fatalf("pull %d: cause %v maps to %d", i, gone, api.CodeOf(gone))
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
	nilWatch.Watch("h1", c1)()
	if nilWatch.Left("h1", "x") != 0 || nilWatch.Running() != 0 {
		t.Fatal("a nil HolderWatch must watch nothing")
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
	err := descriptorsErr(ctx, "p1", "h", fmt.Errorf("api: peer.descriptors on member h: %w", context.Canceled))
	if api.CodeOf(err) != api.CodePeerUnavailable {
		t.Fatalf("code %d: %v", api.CodeOf(err), err)
	}
	if got := readErr(ctx, transport.ErrCanceled); api.CodeOf(got) != api.CodePeerUnavailable {
		t.Fatalf("read: code %d: %v", api.CodeOf(got), got)
	}
	// Shutdown (a plain cancel of the parent) stays transfer_failed.
	parent, stop := context.WithCancel(context.Background())
	child, cc := context.WithCancelCause(parent)
	defer cc(nil)
	stop()
	if got := readErr(child, child.Err()); api.CodeOf(got) != api.CodeTransferFailed {
		t.Fatalf("shutdown: code %d: %v", api.CodeOf(got), got)
	}
}
