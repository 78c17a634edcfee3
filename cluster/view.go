package cluster

import (
	"slices"
	"strings"
	"time"

	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// view is the membership state machine: who is live, who is suspect, who
// is gone for good. It does no I/O and reads no clock; the provider feeds
// it events stamped with now and carries out the effects it returns
// (publish, probe, update protoactor's topology, notify subscribers).
type view struct {
	suspectAfter time.Duration // silence before a member is probed (at least)
	suspectCap   time.Duration // the most a member's own lag may stretch suspectAfter to
	deadAfter    time.Duration // silence before a member is removed (TTL)
	probeEvery   time.Duration // pause between two probes of one suspect
	suspectMult  int           // heartbeats missed before suspicion (Config.SuspectMult)
	jitter       float64       // Config.HeartbeatJitter
	fullInterval time.Duration // Config.HeartbeatInterval
	beatEvery    time.Duration // our own heartbeat interval now (Config.HeartbeatInterval until told)

	self    *Member // nil on a client, which is not a member
	evicted bool    // the others removed self
	members map[string]*memberEntry
	gone    map[string]*tombstone // removed ids; protoactor blocks them for good, so do we
	// lastTick is when tick last ran. A gap much longer than the tick
	// cadence means this process was paused (SIGSTOP, a long GC, a VM
	// freeze): the others' silence was ours, so it proves nothing.
	lastTick time.Time
	// lag is the time, summed since the view began, in which this
	// member could not have heard the others: its own loop woke late
	// (woke), or the bus stopped delivering its own heartbeat back to it
	// (tick). Silence is judged without it (silence).
	lag time.Duration
	// lateSinceTick is the part of lag woke added since the last tick, so
	// that a bus stall over the same time is not counted twice.
	lateSinceTick time.Duration
	// lastEcho is when our own heartbeat last came back through NATS:
	// the latest moment the bus is known to deliver. Zero on a client.
	lastEcho time.Time
	// echoDue is when our next echo is overdue: one jittered interval and
	// half an interval (of beatEvery) after lastEcho, or after we last
	// changed our interval, whichever is later.
	echoDue time.Time
}

type memberEntry struct {
	m          Member
	lastSeen   time.Time     // last heartbeat or probe answer
	lagAtSeen  time.Duration // view.lag at lastSeen
	gaps       gapWindow     // its recent heartbeat gaps at its announced interval, our own lag excluded
	interval   time.Duration // the heartbeat interval it announced (0: not said)
	probing    bool          // a probe is in flight
	probeEnded time.Time     // when the last probe ended; zero if none yet
}

type tombstone struct {
	reason      Reason
	lastRefuted time.Time // last time we told it that it is dead
}

func newView(cfg Config, self *Member) *view {
	v := &view{
		suspectAfter: cfg.SuspectAfter(),
		suspectCap:   suspectCap(cfg.SuspectAfter(), cfg.TTL()),
		deadAfter:    cfg.TTL(),
		probeEvery:   cfg.HeartbeatInterval,
		suspectMult:  cfg.SuspectMult,
		jitter:       cfg.HeartbeatJitter,
		fullInterval: cfg.HeartbeatInterval,
		beatEvery:    cfg.HeartbeatInterval,
		members:      map[string]*memberEntry{},
		gone:         map[string]*tombstone{},
	}
	if self != nil {
		s := self.clone()
		v.self = &s
	}
	return v
}

// heartbeat records that m announced itself at now.
func (v *view) heartbeat(m Member, now time.Time) effects {
	var fx effects
	if v.isSelf(m.ID) {
		// Our own heartbeat, back through NATS: the bus delivers.
		v.lastEcho = now
		v.echoDue = later(v.echoDue, now.Add(v.echoGrace()))
		return fx
	}
	if t, dead := v.gone[m.ID]; dead {
		// A zombie (hung, partitioned, or too slow) is still talking. Tell
		// it, at most once per suspicion period, so that it can rejoin
		// under a new id.
		if t.lastRefuted.IsZero() || now.Sub(t.lastRefuted) >= v.suspectAfter {
			t.lastRefuted = now
			fx.refute = append(fx.refute, m.ID)
		}
		return fx
	}
	m.Suspect = false
	e, known := v.members[m.ID]
	if !known {
		v.members[m.ID] = &memberEntry{m: m.clone(), lastSeen: now, lagAtSeen: v.lag, interval: m.HeartbeatInterval}
		fx.event(EventJoined, m, "")
		fx.announce = true // let the newcomer learn us without waiting a period
		return fx
	}
	e.gaps.add(v.silence(e, now))
	if m.HeartbeatInterval != e.interval {
		// It turned idle or busy: the gaps it kept at the old interval
		// say nothing of the new one.
		e.interval, e.gaps = m.HeartbeatInterval, gapWindow{}
	}
	e.lastSeen, e.lagAtSeen = now, v.lag
	if e.m.Suspect {
		e.m.Suspect = false
		fx.event(EventAlive, e.m, "")
	}
	if !sameMember(e.m, m) {
		e.m = m.clone()
		fx.changed = true
	}
	return fx
}

// probeAnswered records a probe of m that got an answer at now.
func (v *view) probeAnswered(m Member, now time.Time) effects {
	if e, ok := v.members[m.ID]; ok {
		e.probing = false
		e.probeEnded = now
	}
	return v.heartbeat(m, now)
}

// probeFailed records a probe of id that got no answer: unreachable means
// NATS had no subscriber for it (its connection is gone: it crashed);
// otherwise the probe timed out (it may be hung) and the TTL decides.
func (v *view) probeFailed(id string, unreachable bool, now time.Time) effects {
	var fx effects
	e, ok := v.members[id]
	if !ok {
		return fx
	}
	e.probing = false
	e.probeEnded = now
	if unreachable {
		v.remove(&fx, e, ReasonUnreachable, true)
	}
	return fx
}

// hint says that something other than heartbeats (protoactor lost its
// gRPC stream to the member) suggests id may be dead: suspect and probe it
// now instead of waiting for the silence.
func (v *view) hint(id string, now time.Time) effects {
	var fx effects
	e, ok := v.members[id]
	if !ok {
		return fx
	}
	v.suspect(&fx, e)
	v.maybeProbe(&fx, e, now, true)
	return fx
}

// left records that id is gone: its own graceful leave (reporter == id)
// or a dead notice from reporter.
func (v *view) left(id, reporter string, now time.Time) effects {
	var fx effects
	reason := ReasonReported
	if reporter == id {
		reason = ReasonLeave
	}
	if v.isSelf(id) {
		if reason != ReasonLeave && !v.evicted {
			v.evicted = true
			fx.event(EventSelfEvicted, *v.self, reason)
		}
		return fx
	}
	if e, ok := v.members[id]; ok {
		v.remove(&fx, e, reason, false)
		return fx
	}
	if _, ok := v.gone[id]; !ok {
		// Never seen (we joined after it, or the notice overtook its
		// heartbeat): remember it so that a late heartbeat cannot add it.
		v.gone[id] = &tombstone{reason: reason}
	}
	return fx
}

// blocked records that protoactor blocked id on its own (gossip heartbeat
// expiry); keep our view equal to its topology.
func (v *view) blocked(id string) effects {
	var fx effects
	if e, ok := v.members[id]; ok {
		v.remove(&fx, e, ReasonBlocked, false)
	}
	return fx
}

// reconnected forgives the silence of everyone: our own NATS link was down,
// so missing heartbeats prove nothing about the others.
func (v *view) reconnected(now time.Time) {
	for _, e := range v.members {
		e.lastSeen, e.lagAtSeen = now, v.lag
	}
}

// woke records that this process's membership loop, which asked to wake
// at due, woke at now: the lateness is our own lag (the process was
// CPU-starved, descheduled, in a GC pause), during which heartbeats that
// were sent could not be read. It is not counted as anyone's silence. The
// provider calls it first on every wake, before it applies what woke it.
func (v *view) woke(now, due time.Time) {
	if !due.IsZero() && now.After(due) {
		v.lag += now.Sub(due)
		v.lateSinceTick += now.Sub(due)
	}
}

// busStall is how much of the time since the last tick the bus was
// overdue with our own heartbeat: past lastEcho plus echoGrace, NATS (or
// the process hosting it, CPU-starved) delivered nothing to us, so the
// others' heartbeats may be stuck there too. Zero before the first echo
// and on a client, which sends no heartbeats.
func (v *view) busStall(now time.Time) time.Duration {
	if v.lastEcho.IsZero() || v.lastTick.IsZero() {
		return 0
	}
	return max(0, now.Sub(later(v.lastTick, v.echoDue)))
}

// echoGrace is how long after an echo the next one is overdue: one
// jittered interval of ours and half an interval.
func (v *view) echoGrace() time.Duration {
	return maxHeartbeatGap(v.beatEvery, v.jitter) + v.beatEvery/2
}

// beatsEvery records that from now this member heartbeats every d (it
// turned idle or busy): our next echo is due one grace of the new
// interval from now at the earliest, so a switch to a shorter interval
// does not make the echo of the longer one overdue.
func (v *view) beatsEvery(d time.Duration, now time.Time) {
	if d == v.beatEvery || d <= 0 {
		return
	}
	v.beatEvery = d
	if !v.lastEcho.IsZero() {
		v.echoDue = later(v.echoDue, now.Add(v.echoGrace()))
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// silence is how long e has been silent as far as this process could
// hear: the time since its last heartbeat less our own lag since then.
func (v *view) silence(e *memberEntry, now time.Time) time.Duration {
	return max(0, now.Sub(e.lastSeen)-(v.lag-e.lagAtSeen))
}

// suspectAfterFor is the silence after which e is suspected: SuspectMult
// of its own heartbeats, each as long as the longest of its recent gaps
// (a CPU-starved member beats late), or as the interval it announced
// where that is longer than ours (an idle member beats slowly), never less
// than the configured SuspectAfter nor more than suspectCap.
func (v *view) suspectAfterFor(e *memberEntry) time.Duration {
	base := v.suspectAfter
	if e.interval > v.fullInterval {
		base = max(base, min(v.suspectCap, time.Duration(v.suspectMult)*e.interval))
	}
	return suspicionTimeout(base, v.suspectMult, e.gaps.longest(), v.suspectCap)
}

// tick applies the passage of time: suspect and probe the silent, remove
// those silent for the TTL.
func (v *view) tick(now time.Time) effects {
	var fx effects
	// Time the bus was stalled is not anyone's silence either; where our
	// own loop was late over the same time, it is counted once.
	if stall := v.busStall(now); stall > v.lateSinceTick {
		v.lag += stall - v.lateSinceTick
	}
	// A pause is a gap between ticks that our loop's lateness does not
	// explain: that lateness is lag already, which silence leaves out. An
	// idle member sleeps up to a jittered idle interval between ticks, so
	// a starved one would otherwise pass pausedAfter on every wake and
	// forgive a hung peer forever.
	if !v.lastTick.IsZero() && now.Sub(v.lastTick)-v.lateSinceTick > pausedAfter(v.suspectAfter, v.deadAfter) {
		v.reconnected(now)
	}
	v.lateSinceTick = 0
	v.lastTick = now
	for _, id := range v.ids() {
		e := v.members[id]
		silence := v.silence(e, now)
		switch {
		case silence >= v.deadAfter:
			v.remove(&fx, e, ReasonTimeout, true)
		case silence >= v.suspectAfterFor(e) || e.m.Suspect:
			v.suspect(&fx, e)
			v.maybeProbe(&fx, e, now, false)
		}
	}
	return fx
}

// nextDeadline is when tick next has something to do; zero if never.
func (v *view) nextDeadline() time.Time {
	var next time.Time
	earlier := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for _, e := range v.members {
		// Our own lag since lastSeen pushes its deadlines back.
		seen := e.lastSeen.Add(v.lag - e.lagAtSeen)
		if !e.m.Suspect {
			earlier(seen.Add(v.suspectAfterFor(e)))
			continue
		}
		earlier(seen.Add(v.deadAfter))
		if !e.probing {
			earlier(e.probeEnded.Add(v.probeEvery))
		}
	}
	return next
}

// liveMembers is everyone in the topology, self first if a member (even
// once evicted: protoactor must not block itself), then the others by id.
func (v *view) liveMembers() []Member {
	out := make([]Member, 0, len(v.members)+1)
	if v.self != nil {
		out = append(out, v.self.clone())
	}
	for _, id := range v.ids() {
		out = append(out, v.members[id].m.clone())
	}
	return out
}

// idByAddress finds the live member listening on addr ("" if none).
func (v *view) idByAddress(addr string) string {
	for id, e := range v.members {
		if e.m.Address() == addr {
			return id
		}
	}
	return ""
}

func (v *view) isSelf(id string) bool { return v.self != nil && v.self.ID == id }

func (v *view) ids() []string {
	ids := make([]string, 0, len(v.members))
	for id := range v.members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (v *view) suspect(fx *effects, e *memberEntry) {
	if !e.m.Suspect {
		e.m.Suspect = true
		fx.event(EventSuspect, e.m, "")
	}
}

// maybeProbe starts a probe of e unless one is in flight or, when not
// urgent, the last one ended less than probeEvery ago.
func (v *view) maybeProbe(fx *effects, e *memberEntry, now time.Time, urgent bool) {
	if e.probing {
		return
	}
	if !urgent && !e.probeEnded.IsZero() && now.Sub(e.probeEnded) < v.probeEvery {
		return
	}
	e.probing = true
	fx.probe = append(fx.probe, e.m.ID)
}

// remove takes e out of the view for good; report says that this is our
// own finding, to be told to the others.
func (v *view) remove(fx *effects, e *memberEntry, reason Reason, report bool) {
	delete(v.members, e.m.ID)
	v.gone[e.m.ID] = &tombstone{reason: reason}
	fx.event(EventLeft, e.m, reason)
	if report {
		fx.report = append(fx.report, Event{Type: EventLeft, Member: e.m.clone(), Reason: reason})
	}
}

func sameMember(a, b Member) bool {
	if a.record != "" && b.record != "" {
		return a.record == b.record && a.Load == b.Load
	}
	return a.Host == b.Host && a.Port == b.Port && a.Role == b.Role && a.Load == b.Load && a.Name == b.Name &&
		slices.Equal(a.Kinds, b.Kinds) && slices.EqualFunc(a.Engines, b.Engines, func(x, y *messages.EngineInfo) bool { return proto.Equal(x, y) })
}

// effects is what one view step asks the provider to do, in order.
type effects struct {
	events   []Event  // for subscribers, in the order they happened
	probe    []string // probe these members now
	report   []Event  // publish a dead notice for each (our own findings)
	refute   []string // tell these removed members that they are dead
	announce bool     // publish our heartbeat now
	changed  bool     // the live set or a member's record changed
}

func (fx *effects) event(t EventType, m Member, r Reason) {
	fx.events = append(fx.events, Event{Type: t, Member: m.clone(), Reason: r})
	fx.changed = true
}

// topologyChanged is true when protoactor's member list must be updated.
func (fx effects) topologyChanged() bool {
	for _, e := range fx.events {
		if e.Type == EventJoined || e.Type == EventLeft {
			return true
		}
	}
	return false
}

func (fx *effects) merge(o effects) {
	fx.events = append(fx.events, o.events...)
	fx.probe = append(fx.probe, o.probe...)
	fx.report = append(fx.report, o.report...)
	fx.refute = append(fx.refute, o.refute...)
	fx.announce = fx.announce || o.announce
	fx.changed = fx.changed || o.changed
}

// String renders fx for scripted tests: "joined b; probe c; announce".
func (fx effects) String() string {
	var parts []string
	for _, e := range fx.events {
		parts = append(parts, e.String())
	}
	for _, id := range fx.probe {
		parts = append(parts, "probe "+id)
	}
	for _, e := range fx.report {
		parts = append(parts, "report "+e.Member.ID+" ("+string(e.Reason)+")")
	}
	for _, id := range fx.refute {
		parts = append(parts, "refute "+id)
	}
	if fx.announce {
		parts = append(parts, "announce")
	}
	if fx.changed && len(fx.events) == 0 {
		parts = append(parts, "changed")
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

// pausedAfter is the gap between two ticks, less our loop's recorded
// lateness, that means this process itself was paused rather than
// everyone else falling silent. The provider ticks at every beat of its
// own (each one's echo), at most a jittered idle interval apart, which
// Config.Validate keeps under half the TTL; so half the TTL (and never
// less than twice suspectAfter) is beyond a normal gap yet shorter than
// the TTL, so a paused member never times out the others.
func pausedAfter(suspectAfter, deadAfter time.Duration) time.Duration {
	return max(deadAfter/2, 2*suspectAfter)
}
