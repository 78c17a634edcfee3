package pull

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/connex/connex/transport"
)

// HolderWatch ends the pulls that read from a member as soon as cluster
// membership says that member is gone, instead of at the stall deadline.
//
// Over UCX's shared-memory lanes a dead or frozen holder raises no data-plane
// error (UCX 1.13 cannot use peer error handling there), so without this a
// pull from a SIGKILLed holder fails only when a batch has made no progress
// for pull_stall_ms. The cluster's failure detector removes a crashed member
// faster (cluster_preset local ~0.1 s, lan ~0.6 s) and says why; the pull
// then ends with peer_unavailable naming the holder and the reason.
//
// A member the cluster removes while its data plane still works (its NATS
// connection dropped mid-pull) loses its pulls too: the pulls fail with a
// clear error and can be retried once it rejoins. The zero value is ready;
// a nil *HolderWatch watches nothing.
type HolderWatch struct {
	mu    sync.Mutex
	next  uint64
	pulls map[string]map[uint64]*watched // holding member -> running pulls
}

// watched is one running pull: incarnation is the holder's cluster id that
// answered its descriptors ("" until then).
type watched struct {
	cancel      context.CancelCauseFunc
	incarnation string
}

// HolderLeftError is the cause a pull's context is cancelled with when its
// holder leaves the cluster. It wraps transport.ErrPeerGone, so the pull
// ends with peer_unavailable.
type HolderLeftError struct {
	Member string // the holder's member id (API name)
	Reason string // why membership removed it (cluster.Reason: unreachable, timeout, leave, …)
}

// Error says which holder left and why.
func (e *HolderLeftError) Error() string {
	return fmt.Sprintf("holder member %s left the cluster (%s)", e.Member, e.Reason)
}

// Unwrap makes a HolderLeftError a transport.ErrPeerGone.
func (e *HolderLeftError) Unwrap() error { return transport.ErrPeerGone }

// Watch registers a running pull from member; cancel is called with a
// *HolderLeftError if member leaves before the returned unwatch is called.
// bind records which incarnation of member (its cluster id, fresh per
// rejoin) serves the pull: a departure of another incarnation — an
// evicted one, reported after the member rejoined — leaves the pull
// alone. unwatch is idempotent.
func (w *HolderWatch) Watch(member string, cancel context.CancelCauseFunc) (unwatch func(), bind func(incarnation string)) {
	if w == nil || member == "" {
		return func() {}, func(string) {}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pulls == nil {
		w.pulls = map[string]map[uint64]*watched{}
	}
	id := w.next
	w.next++
	m := w.pulls[member]
	if m == nil {
		m = map[uint64]*watched{}
		w.pulls[member] = m
	}
	e := &watched{cancel: cancel}
	m[id] = e
	unwatch = func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if m := w.pulls[member]; m != nil {
			delete(m, id)
			if len(m) == 0 {
				delete(w.pulls, member)
			}
		}
	}
	bind = func(incarnation string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		e.incarnation = incarnation
	}
	return unwatch, bind
}

// Left cancels every watched pull from member with a *HolderLeftError and
// returns how many it cancelled. Pulls that start later are not affected
// (their descriptors request finds no responder, or times out).
func (w *HolderWatch) Left(member, reason string) int { return w.LeftIncarnation(member, "", reason) }

// LeftIncarnation is Left for the departure of one incarnation of member
// (its cluster id): pulls bound to another incarnation carry on, pulls not
// bound yet end. An empty incarnation ends them all.
func (w *HolderWatch) LeftIncarnation(member, incarnation, reason string) int {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	var hit []*watched
	for id, e := range w.pulls[member] {
		if incarnation == "" || e.incarnation == "" || e.incarnation == incarnation {
			hit = append(hit, e)
			delete(w.pulls[member], id)
		}
	}
	if len(w.pulls[member]) == 0 {
		delete(w.pulls, member)
	}
	w.mu.Unlock()
	cause := &HolderLeftError{Member: member, Reason: reason}
	for _, e := range hit {
		e.cancel(cause)
	}
	return len(hit)
}

// Running is how many pulls are watched now.
func (w *HolderWatch) Running() int {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.pulls {
		n += len(m)
	}
	return n
}

// watchHolder derives a pull's context from ctx: member's departure
// cancels it with a *HolderLeftError. end unwatches and cancels it; bind
// is HolderWatch.Watch's.
func (d *PullDeps) watchHolder(ctx context.Context, member string) (pctx context.Context, end func(), bind func(string)) {
	pctx, cancel := context.WithCancelCause(ctx)
	unwatch, bind := d.Holders.Watch(member, cancel)
	return pctx, func() { unwatch(); cancel(nil) }, bind
}

// holderLeft returns the *HolderLeftError ctx was cancelled with, or nil.
func holderLeft(ctx context.Context) error {
	var e *HolderLeftError
	if errors.As(context.Cause(ctx), &e) {
		return e
	}
	return nil
}
