package cluster

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// Membership is what the daemon needs to know about the cluster without
// reaching into protoactor: who is live, in which role, how loaded, and
// when that changes. *Provider implements it.
type Membership interface {
	// Self is this member as it advertises itself (zero on a client).
	Self() Member
	// Members is every live member, this one included, suspects marked.
	Members() []Member
	// MembersByRole is the live members that advertise role.
	MembersByRole(role Role) []Member
	// Member looks up one live member by id.
	Member(id string) (Member, bool)
	// SetLoad sets the load figure the next heartbeat advertises.
	SetLoad(load int64)
	// Subscribe calls fn for every membership event, starting with one
	// EventJoined per member already live, and returns a function that
	// stops the calls. fn runs on the membership goroutine, one event at a
	// time and in order: it must return quickly (send to an actor or a
	// buffered channel) and must not call Subscribe; it may call the other
	// methods and the returned cancel.
	Subscribe(fn func(Event)) (cancel func())
}

var _ Membership = (*Provider)(nil)

// watchers fans events out to subscribers. fire serialises delivery and
// replays, so that a new subscriber sees each member joined exactly once.
type watchers struct {
	fire sync.Mutex // held while delivering events or replaying

	// gen counts the changes Members may show: a new snapshot, or this
	// member's own engines or load (Generation).
	gen atomic.Uint64

	mu       sync.RWMutex // guards the fields below
	snapshot []Member
	subs     map[int]*watcher
	next     int
}

type watcher struct {
	fn        func(Event)
	cancelled atomic.Bool
}

// publishSnapshot records the view's live set and delivers fx's events.
func (p *Provider) publishSnapshot(v *view, fx effects) {
	p.watch.fire.Lock()
	defer p.watch.fire.Unlock()
	p.watch.mu.Lock()
	p.watch.snapshot = v.liveMembers()
	p.watch.gen.Add(1)
	subs := make([]*watcher, 0, len(p.watch.subs))
	for _, w := range p.watch.subs {
		subs = append(subs, w)
	}
	p.watch.mu.Unlock()
	for _, e := range fx.events {
		for _, w := range subs {
			if !w.cancelled.Load() {
				w.fn(e)
			}
		}
	}
}

// Self implements Membership.
func (p *Provider) Self() Member {
	if p.self == nil {
		return Member{}
	}
	m := p.self.clone()
	m.Load = p.load.Load()
	m.HeartbeatInterval = time.Duration(p.interval.Load())
	m.Engines = p.ownEngines()
	return m
}

// Members implements Membership.
func (p *Provider) Members() []Member {
	return p.membersWhere(func(Member) bool { return true })
}

// MembersByRole implements Membership.
func (p *Provider) MembersByRole(role Role) []Member {
	return p.membersWhere(func(m Member) bool { return m.Role == role })
}

// Member implements Membership.
func (p *Provider) Member(id string) (Member, bool) {
	ms := p.membersWhere(func(m Member) bool { return m.ID == id })
	if len(ms) == 0 {
		return Member{}, false
	}
	return ms[0], true
}

// SetLoad implements Membership. A load above zero is work in hand: an
// idle member (a request adopted after a failover raises its load with no
// other Touch) heartbeats at once and returns to the full rate.
func (p *Provider) SetLoad(load int64) {
	p.load.Store(load)
	p.watch.gen.Add(1)
	if load > 0 {
		p.activity.Touch()
	}
}

// Generation changes whenever Members may answer differently (the view
// took a heartbeat, a member came or went, this member's own engines or
// load changed) and at no other time: a caller that derives something from
// Members can keep it while Generation stays the same, instead of copying
// every member per use.
func (p *Provider) Generation() uint64 { return p.watch.gen.Load() }

// SetEngines sets the engines the next heartbeat advertises (the live
// registrations of this member), and announces them at once.
func (p *Provider) SetEngines(es []*messages.EngineInfo) {
	c := make([]*messages.EngineInfo, len(es))
	for i, e := range es {
		c[i] = proto.Clone(e).(*messages.EngineInfo)
	}
	p.engines.Store(&c)
	p.watch.gen.Add(1)
	select {
	case p.announceNow <- struct{}{}:
	default:
	}
}

func (p *Provider) ownEngines() []*messages.EngineInfo {
	es := p.engines.Load()
	if es == nil || len(*es) == 0 {
		return nil
	}
	out := make([]*messages.EngineInfo, len(*es))
	for i, e := range *es {
		out[i] = proto.Clone(e).(*messages.EngineInfo)
	}
	return out
}

// Subscribe implements Membership.
func (p *Provider) Subscribe(fn func(Event)) (cancel func()) {
	w := &watcher{fn: fn}
	p.watch.fire.Lock()
	for _, m := range p.Members() {
		fn(Event{Type: EventJoined, Member: m})
	}
	p.watch.mu.Lock()
	if p.watch.subs == nil {
		p.watch.subs = map[int]*watcher{}
	}
	id := p.watch.next
	p.watch.next++
	p.watch.subs[id] = w
	p.watch.mu.Unlock()
	p.watch.fire.Unlock()
	return func() {
		w.cancelled.Store(true)
		p.watch.mu.Lock()
		delete(p.watch.subs, id)
		p.watch.mu.Unlock()
	}
}

func (p *Provider) membersWhere(keep func(Member) bool) []Member {
	p.watch.mu.RLock()
	defer p.watch.mu.RUnlock()
	var out []Member
	for _, m := range p.watch.snapshot {
		if p.self != nil && m.ID == p.self.ID {
			m.Load = p.load.Load() // ours is fresher than the view's copy
			m.Engines = p.ownEngines()
		}
		if keep(m) {
			out = append(out, m.clone())
		}
	}
	return out
}
