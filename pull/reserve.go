package pull

import (
	"sync"
	"time"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
)

// A reservation takes the holder's round trip off a pull's path (issue 46).
// A decode engine starts its request (request.start) before it pulls the
// request's hold (pull.start, at its next step), and a small pull's time is
// that round trip. So when request.start has been answered, the decode
// member sends the hold's peer.descriptors request itself, under a read id
// of its own: the holder registers that read (lease.PullStart: the lease
// renewed, a read mark that keeps the blocks until its PullEnd or deadline)
// and answers with the descriptors, which wait in the reservation's answer
// channel. The engine's pull.start of the same transfer into a region of
// the same layout takes the reservation (StartPuller): its first answer is
// already in hand, it reads at once, under the read mark registered before
// it, and it ends that read with its PullEnd like any pull. The invariants
// hold as for a pull that asked itself: its reads run under a read mark the
// holder answered for (a hold that answered live, whose read mark is
// within its deadline, cannot have been freed: a release or expiry waits
// for the read's end), the holder knows the read by its id for its PullEnd,
// and the pull's deadline is the reservation's where that comes first, so
// the reads never outlive the read mark.
//
// Why not the two designs that keep a holder message on the pull's path
// (the descriptors fetched early but the read registered by pull.start,
// or reads issued beside the registration from descriptors cached from an
// earlier pull): a pull must not report its blocks loaded before the
// holder answers for the read, so pull.done would still wait for one
// round trip to the holder. make bench-pull's nats_floor (the four
// messages of such a pull through bare relays) is 1.5-2.3x its api_floor
// on the 2-core VM: such a pull is at issue 46's goal (1.5x) before
// connexd does any work, and they save only the read.
//
// An unused reservation is dropped — its answers unsubscribed, its read
// ended with a PullEnd that says not ok, in the background — reserveTTL
// after it was sent, at its request's request.finish (Unreserve), when a
// pull of the same transfer by the same engine does not fit it, or when
// connexd stops (CloseReservations). Until then a release of the hold waits
// for it, as for any running read; a member that dies or freezes holding
// one leaves the read to the holder's deadline, so that deadline is short
// (reserveReadTimeout, not pull_timeout_ms): a pull takes a reservation
// only when its bytes can be read well within what is left of it, and a
// pull too large for that asks for itself (its round trip weighs little
// on a long read anyway).

// reserveTTL is how long a reservation waits for its pull.start: more than
// the step an engine takes between request.start's answer and the pull it
// then starts, short enough that a request that never pulls (its engine
// computes the prompt itself) holds up a release of the hold only briefly.
const reserveTTL = 2 * time.Second

// reserveReadTimeout is a reserved read's timeout at the holder: what a
// dead or frozen member's reservation keeps a release of the hold waiting
// (plus the holder's slack), at most.
const reserveReadTimeout = 5 * time.Second

// reserveMinRate (bytes/s) and reserveMargin size the pulls a reservation
// may serve: bytes at the slowest rate the stall rule lets a data plane
// without progress reports go (a batch of 64 MiB per second), plus a
// margin, within the time the read has left.
const (
	reserveMinRate = 64 << 20
	reserveMargin  = time.Second
)

// reserveEndTimeout bounds the wait for the holder's answer to an unused
// reservation's PullEnd (nothing waits for it but connexd's shutdown).
const reserveEndTimeout = time.Second

// reservation is one read reserved at the holder ahead of its pull.
type reservation struct {
	key     reserveKey
	request string // the request whose request.start made it
	layout  kvmem.Layout
	req     *messages.DescriptorsRequest // the reserved read (re-asks repeat it)
	member  string                       // the holder's member
	asks    *api.Asks
	sent    time.Time
	// deadline is when the reads of the pull that takes it must be over:
	// the holder abandons the read at its timeout (capped at the lease)
	// after it registered it, which is after sent.
	deadline time.Time
	ttl      clock.Timer
}

// reserveKey names a reservation: the decode engine and the transfer.
type reserveKey struct{ engine, transfer string }

// reservations are the reads this member reserved ahead of their pulls.
type reservations struct {
	mu     sync.Mutex
	m      map[reserveKey]*reservation
	closed bool
}

// Reserve sends the peer.descriptors request of the pull that engine
// (whose one region has layout l) will start of the hold params names, for
// request requestID, under a read id of this member's (see reservation).
// timeout is the read's deadline at the holder (pull_timeout_ms), at most
// reserveReadTimeout. It never fails a request: where it cannot reserve
// (one is there already, the request could not be sent, connexd is
// stopping) the pull asks for itself.
func (d *PullDeps) Reserve(engine, requestID string, params *messages.KVTransferParams, l kvmem.Layout, timeout time.Duration) {
	key := reserveKey{engine, params.GetTransferId()}
	rs := &d.reserved
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if _, dup := rs.m[key]; dup || rs.closed {
		return
	}
	now := d.clock().Now()
	timeout = min(timeout, reserveReadTimeout)
	r := &reservation{
		key: key, request: requestID, layout: l, member: params.GetRemoteCtrl().GetMember(), sent: now,
		deadline: now.Add(readBudget(timeout, params.GetRetainS())),
		req: &messages.DescriptorsRequest{
			TransferId: key.transfer, Requester: engine, PullId: "rsv-" + actors.NewTransferID()[:16], RequestId: requestID,
			Layout: actors.LayoutToProto(l), TimeoutMs: uint32(timeout / time.Millisecond),
		},
	}
	peer := &api.Client{NC: d.NC, Member: r.member}
	asks, err := peer.NewAsks(api.EpPeerDescriptors)
	if err != nil {
		d.Log.Debug("pull reservation not made", "transfer", key.transfer, "engine", engine, "err", err)
		return
	}
	if err := asks.Post(r.req); err != nil {
		asks.Close()
		d.Log.Debug("pull reservation not sent", "transfer", key.transfer, "engine", engine, "err", err)
		return
	}
	r.asks = asks
	r.ttl = d.clock().AfterFunc(reserveTTL, func() { d.dropReservation(key, r, "unused") })
	if rs.m == nil {
		rs.m = map[reserveKey]*reservation{}
	}
	rs.m[key] = r
}

// readBudget is how long after its PullStart a read may run before the
// holder abandons it: the reader's timeout, capped at the lease's retain_s
// (the hold actor's own cap; it adds a slack of its own).
func readBudget(timeout time.Duration, retainS uint32) time.Duration {
	if retain := time.Duration(retainS) * time.Second; retain > 0 && retain < timeout {
		return retain
	}
	return timeout
}

// takeReservation hands p its reservation, if one fits: the same engine
// and transfer (the key), a region of the layout the holder checked, and
// time left before the read mark's deadline. One that does not fit is
// dropped; the pull asks itself then.
func (d *PullDeps) takeReservation(p *Pull, now time.Time) *reservation {
	key := reserveKey{p.Dst.Engine, p.Params.GetTransferId()}
	rs := &d.reserved
	rs.mu.Lock()
	r := rs.m[key]
	if r != nil {
		delete(rs.m, key)
		r.ttl.Stop()
	}
	rs.mu.Unlock()
	if r == nil {
		return nil
	}
	if why := r.unfit(p, now); why != "" {
		d.endReservation(r, why)
		return nil
	}
	return r
}

// unfit says why r cannot serve p at now ("": it can). The holder checked
// the reservation's layout and member; the pull's own must be the same,
// and the read mark must outlast the pull's start by what its bytes take
// at reserveMinRate, plus reserveMargin (a pull that could read for less
// might fail where asking for itself would not).
func (r *reservation) unfit(p *Pull, now time.Time) string {
	switch {
	case p.Dst.Region.Layout != r.layout:
		return "layout differs"
	case p.Params.GetRemoteCtrl().GetMember() != r.member:
		return "holder differs"
	case r.deadline.Sub(now) < reserveMargin+readTime(pullBytes(p)):
		return "too little time left for its bytes"
	}
	return ""
}

// pullBytes is how many bytes p writes into its destination blocks.
func pullBytes(p *Pull) uint64 {
	l := p.Dst.Region.Layout
	return uint64(l.Layers) * uint64(l.Planes) * l.BlockBytes * uint64(len(p.DstBlocks))
}

// readTime is how long n bytes take at reserveMinRate.
func readTime(n uint64) time.Duration {
	return time.Duration(float64(n) / reserveMinRate * float64(time.Second))
}

// Unreserve drops the reservations of request requestID (request.finish:
// a request that ends without pulling does not keep its hold's release
// waiting for reserveTTL).
func (d *PullDeps) Unreserve(requestID string) {
	rs := &d.reserved
	rs.mu.Lock()
	var out []*reservation
	for k, r := range rs.m {
		if r.request == requestID {
			delete(rs.m, k)
			r.ttl.Stop()
			out = append(out, r)
		}
	}
	rs.mu.Unlock()
	for _, r := range out {
		d.endReservation(r, "request finished")
	}
}

// CloseReservations drops every reservation and refuses new ones
// (connexd stopping, before it waits for its background work).
func (d *PullDeps) CloseReservations() {
	rs := &d.reserved
	rs.mu.Lock()
	all := rs.m
	rs.m, rs.closed = nil, true
	for _, r := range all {
		r.ttl.Stop()
	}
	rs.mu.Unlock()
	for _, r := range all {
		d.endReservation(r, "connexd stopping")
	}
}

// dropReservation drops r if it is still the reservation under key.
func (d *PullDeps) dropReservation(key reserveKey, r *reservation, why string) {
	rs := &d.reserved
	rs.mu.Lock()
	if rs.m[key] != r {
		rs.mu.Unlock()
		return
	}
	delete(rs.m, key)
	rs.mu.Unlock()
	d.endReservation(r, why)
}

// endReservation ends an unused reservation: its answers are dropped and
// the read it may have registered at the holder ends, not ok, in the
// background (as a pull whose descriptors failed ends its read).
func (d *PullDeps) endReservation(r *reservation, why string) {
	d.Metrics.ReservationsDropped.Add(1)
	r.asks.Close()
	d.Log.Debug("pull reservation dropped", "transfer", r.key.transfer, "engine", r.key.engine, "read", r.req.PullId, "why", why)
	peer := &api.Client{NC: d.NC, Member: r.member}
	d.goBackground(func() { _ = endRead(peer, r.req, false, reserveEndTimeout) })
}
