package cluster

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
)

// slowTopologyUpdate is when a MemberList.UpdateClusterTopology call is
// worth a warning.
const slowTopologyUpdate = 50 * time.Millisecond

// Inputs to the loop, each turned into one view step.
type (
	inHeartbeat struct {
		m      Member
		probed bool // the answer to our probe, not a broadcast
	}
	inGone struct {
		id       string
		reporter string // == id for a graceful leave
	}
	inProbeFailed struct {
		id          string
		unreachable bool // NATS had no subscriber for its ping subject
	}
	inHint struct{ addr string } // protoactor lost its stream to addr
)

// run is the provider's only goroutine that touches the view: it feeds the
// view NATS input and the clock, and carries out the effects.
func (p *Provider) run(v *view) {
	defer close(p.loopDone)
	var seq uint64
	var enc announceEncoder
	// lastBusy is when this member last had work in hand: its start (a
	// joining member beats at the full rate), a beat with its load above
	// zero or Activity's inHand true, or the last Activity.Touch.
	lastBusy := time.Now()
	var nextBeat, lastBeat time.Time
	// Our engines changed since the last beat: an announce out of turn,
	// at most every minAnnounce.
	enginesChanged := false
	minAnnounce := p.cfg.HeartbeatInterval / 4
	beat := func(now time.Time) {
		lastBeat, enginesChanged = now, false
		// Say idle before reading the load and the last Touch: a Touch
		// (or SetLoad) from now on either is read below or finds idle set
		// and wakes the loop, never neither. A busy beat clears it below;
		// a Touch in between costs one wake that announces nothing.
		p.activity.idle.Store(true)
		if p.load.Load() > 0 || p.activity.working() {
			lastBusy = now
		}
		if t := p.activity.lastTouch(); t.After(lastBusy) {
			lastBusy = t
		}
		iv := beatInterval(p.cfg.HeartbeatInterval, p.cfg.IdleHeartbeatInterval, p.cfg.idleAfter(), lastBusy, now)
		p.interval.Store(int64(iv))
		p.activity.idle.Store(iv != p.cfg.HeartbeatInterval)
		v.beatsEvery(iv, now)
		nextBeat = now.Add(jittered(iv, p.cfg.HeartbeatJitter, rand.Float64()))
		if p.self == nil || p.evicted.Load() || p.frozen.Load() || p.left.Load() {
			return
		}
		b, err := enc.encode(p.self, p.engines.Load(), p.load.Load(), iv, seq, now)
		if err == nil {
			err = p.nc.Publish(p.subj.heartbeat(p.self.ID), b)
		}
		if err != nil {
			p.log.Debug("heartbeat", slog.Any("error", err))
		}
		seq++
	}
	now := time.Now()
	beat(now)
	linkUp := true
	wake := nextBeat // when the loop asked to be woken at the latest
	timer := time.NewTimer(time.Until(wake))
	defer timer.Stop()
	for {
		var fx effects
		var in any
		select {
		case <-p.done:
			return
		case in = <-p.inbox:
		case <-p.announceNow:
			// Our engines changed: announce now, or at most every
			// minAnnounce (an engine re-registering in a loop must not
			// make its member flood every member's heartbeat subscription).
			enginesChanged = true
		case <-p.activity.wake:
			// Work arrived while we beat at the idle interval: say so at
			// once, so that peers suspect us at the full rate again.
			fx.announce = p.activity.idle.Load()
		case <-timer.C:
		}
		now := time.Now()
		// Lateness past our own deadline is our lag (CPU-starved, GC):
		// the others' heartbeats waited with us and must not count as
		// their silence.
		v.woke(now, wake)
		if in != nil {
			fx.merge(p.apply(v, in, now))
		}
		// What is already queued was heard before this tick judges
		// silence: a late timer must not see heartbeats that merely
		// queued behind it.
		for n := len(p.inbox); n > 0; n-- {
			fx.merge(p.apply(v, <-p.inbox, now))
		}
		if !now.Before(nextBeat) {
			beat(now)
			fx.merge(p.checkBlocked(v))
		}
		linkUp = p.checkLink(v, linkUp, now)
		if linkUp {
			// While our own NATS link is down, silence proves nothing.
			fx.merge(v.tick(now))
		}
		if enginesChanged && !fx.announce {
			if next := lastBeat.Add(minAnnounce); now.Before(next) {
				nextBeat = earliest(nextBeat, next) // soon, not now
			} else {
				fx.announce = true
			}
		}
		if fx.announce {
			beat(now)
		}
		p.carryOut(v, fx)

		wake = nextBeat
		if d := v.nextDeadline(); !d.IsZero() && d.Before(wake) {
			wake = d
		}
		if wake.Before(now) {
			// A deadline already past (a suspect's next probe that must
			// wait for the one in flight) is no lateness of ours.
			wake = now
		}
		timer.Reset(time.Until(wake))
	}
}

// earliest is the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (p *Provider) apply(v *view, in any, now time.Time) effects {
	switch in := in.(type) {
	case inHeartbeat:
		if in.probed {
			return v.probeAnswered(in.m, now)
		}
		return v.heartbeat(in.m, now)
	case inGone:
		return v.left(in.id, in.reporter, now)
	case inProbeFailed:
		return v.probeFailed(in.id, in.unreachable, now)
	case inHint:
		if id := v.idByAddress(in.addr); id != "" {
			p.log.Debug("protoactor lost its stream to a member; probing", slog.String("member", id))
			return v.hint(id, now)
		}
	}
	return effects{}
}

// carryOut does what a view step asked for: probes, notices, protoactor's
// topology, then subscribers.
func (p *Provider) carryOut(v *view, fx effects) {
	for _, id := range fx.probe {
		go p.probe(id)
	}
	reporter := p.cl.ActorSystem.ID
	for _, e := range fx.report {
		if err := p.publish(p.subj.dead(e.Member.ID), goneOf(e.Member.ID, reporter, e.Reason)); err != nil {
			p.log.Debug("dead notice", slog.Any("error", err))
		}
	}
	for _, id := range fx.refute {
		if err := p.publish(p.subj.dead(id), goneOf(id, reporter, ReasonReported)); err != nil {
			p.log.Debug("refute", slog.Any("error", err))
		}
	}
	if fx.topologyChanged() {
		start := time.Now()
		p.cl.MemberList.UpdateClusterTopology(toActorMembers(v.liveMembers()))
		if d := time.Since(start); d > slowTopologyUpdate {
			// protoactor runs its event-stream handlers inline; a slow one
			// delays failure detection for everyone.
			p.log.Warn("protoactor topology update was slow", slog.Duration("took", d))
		}
	}
	for _, e := range fx.events {
		switch e.Type {
		case EventJoined, EventLeft:
			p.log.Info("member "+e.Type.String(), slog.String("member", e.Member.ID),
				slog.String("role", string(e.Member.Role)), slog.String("address", e.Member.Address()),
				slog.String("reason", string(e.Reason)))
		case EventSelfEvicted:
			p.evicted.Store(true)
			p.log.Warn("evicted by the other members; this ActorSystem must be restarted with a new id",
				slog.String("member", e.Member.ID))
		default:
			p.log.Debug("member "+e.Type.String(), slog.String("member", e.Member.ID))
		}
	}
	if fx.changed {
		p.publishSnapshot(v, fx)
	}
}

// probe asks id whether it lives and reports the outcome to the loop.
func (p *Provider) probe(id string) {
	msg, err := p.nc.Request(p.subj.ping(id), nil, p.cfg.ProbeTimeout)
	p.send(probeOutcome(id, msg, err))
}

// probeOutcome is the loop's input for the answer to a probe of id: its
// announce (alive), its leave (it answered "left"), no subscriber
// (unreachable: its connection is gone) or anything else (no answer: the
// TTL decides).
func probeOutcome(id string, msg *nats.Msg, err error) any {
	switch {
	case err == nil:
		if msg.Header.Get(probeStateHeader) == probeStateLeft {
			return inGone{id: id, reporter: id}
		}
		if m, merr := decodeAnnounce(msg.Data); merr == nil && m.ID == id {
			return inHeartbeat{m: m, probed: true}
		}
	case errors.Is(err, nats.ErrNoResponders):
		return inProbeFailed{id: id, unreachable: true}
	}
	return inProbeFailed{id: id}
}

// checkLink watches our own NATS connection: when it comes back, everyone
// is forgiven the silence we could not hear.
func (p *Provider) checkLink(v *view, wasUp bool, now time.Time) bool {
	up := p.nc.Status() == nats.CONNECTED
	switch {
	case up && !wasUp:
		p.log.Info("NATS link back; restarting silence timers")
		v.reconnected(now)
	case !up && wasUp:
		p.log.Warn("NATS link down; membership frozen until it returns")
	}
	return up
}

// checkBlocked removes members that protoactor blocked on its own.
func (p *Provider) checkBlocked(v *view) effects {
	var fx effects
	bl := p.cl.Remote.BlockList()
	for _, id := range v.ids() {
		if bl.IsBlocked(id) {
			fx.merge(v.blocked(id))
		}
	}
	return fx
}
