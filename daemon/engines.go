package daemon

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/connex/connex/advertise"
	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/cluster"
	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// engineAPI answers engine.register and keeps the engines registered with
// this member (advertise.Registry): every change (a new engine, a lapse,
// engine.gone, a probe finding the process gone) is advertised in this
// member's heartbeat at once, and the requests of an engine that is gone
// end after engineLostGrace.
type engineAPI struct {
	member        string // member_id
	role          string // this member's role: the engine roles it hosts
	authenticated bool   // NATS authentication: registrations are checked against credentials

	mu  sync.Mutex
	reg *advertise.Registry
	// advMu makes reading the registry and publishing the read into the
	// heartbeat one step (advertise); taken before mu, never under it.
	advMu sync.Mutex
	// registered is closed (and forgotten) at the next registration: the
	// expiry and probe loops wait on it while nothing is registered,
	// instead of waking four times a second for nothing (a router never
	// has engines of its own).
	registered chan struct{}

	creds credChecker
	// hosts checks that an engine's base_url names its own host (a zero
	// policy, in unit tests, checks nothing).
	hosts     advertise.HostPolicy
	blocks    engineBlocks
	journal   noticeMarks
	journalID string
	// adv carries the live registrations in this member's heartbeat; nil
	// without membership.
	adv advertiser
	// peers says which engines the other members advertise: an engine id
	// is refused while another member serves it (nil without membership).
	peers    memberList
	requests requestEnder
	clock    clock.Clock
	stop     <-chan struct{} // closed when connexd stops: pending ends are dropped
	log      *slog.Logger
}

// credChecker checks an engine's registration against the credentials of
// its connections (enginecreds.go).
type credChecker interface {
	check(ctx context.Context, engine, role, model string) error
	forget(engine string)
}

// engineBlocks is how many blocks an engine's regions here have
// (kvmem.RegionTable.EngineBlocks): a registration claims no more.
type engineBlocks interface {
	EngineBlocks(engine string) uint32
}

// noticeMarks is what registration reads and forgets of the notice
// journal (notices.Journal).
type noticeMarks interface {
	Last(engine string) uint64
	Forget(engine string)
}

// advertiser puts the live registrations into this member's heartbeat
// (clusterMembers.SetEngines).
type advertiser interface {
	SetEngines(es []*messages.EngineInfo)
}

// memberList is the cluster's live members as this member sees them
// (clusterMembers.Members): who advertises which engines.
type memberList interface {
	Members() []cluster.Member
}

// engineElsewhere names a member other than self that advertises engine
// in its heartbeats ("" if none).
func engineElsewhere(ml memberList, self, engine string) string {
	if ml == nil {
		return ""
	}
	for _, m := range ml.Members() {
		if m.Name == "" || m.Name == self {
			continue
		}
		for _, e := range m.Engines {
			if e.GetEngineId() == engine {
				return m.Name
			}
		}
	}
	return ""
}

// requestEnder ends the requests of an engine instance that is gone
// (requestAPI.endEngine).
type requestEnder interface {
	endEngine(engine, instance string)
}

// engineLostGrace is how long after an engine left its requests wait for a
// takeover before they end: an engine that shuts down hands its streams
// back to the router (an error event) and says engine.gone at once, and
// the router's resume must win that race.
const engineLostGrace = 2 * time.Second

// RegisterEngine registers or refreshes an engine with this member.
func (a *engineAPI) RegisterEngine(ctx context.Context, r *messages.RegisterEngineRequest) (*messages.RegisterEngineReply, error) {
	if r.GetEngine() != nil {
		if err := acting(ctx, "engine.engine_id", &r.Engine.EngineId); err != nil {
			return nil, err
		}
	}
	ttl, err := advertise.Validate(r, api.ValidToken)
	if err != nil {
		return nil, api.Errorf(api.CodeBadRequest, "%v", err)
	}
	e := r.GetEngine()
	// Nothing an engine says about itself is believed unchecked: its role
	// must be one this member hosts and its credentials allow, with a
	// model they allow; its blocks are at most those of its regions here.
	if err := advertise.CheckRole(e.GetRole(), a.role); err != nil {
		return nil, api.Errorf(api.CodeForbidden, "engine.register of %s on member %s: %v", e.GetEngineId(), a.member, err)
	}
	if _, scoped := api.CallerEngine(ctx); scoped && a.authenticated {
		if err := a.creds.check(ctx, e.GetEngineId(), e.GetRole(), e.GetModel()); err != nil {
			return nil, err
		}
	}
	// Engine ids are the cluster's: the router and the status name engines
	// by id alone (notices and inboxes carry the member too, so two of one
	// id would not read each other's, but would be routed as one). Checked
	// when an engine registers here first, not at its renewals: two members
	// that took one id in the same moment must not refuse each other's
	// renewals into a flapping pair, and a renewal scans no member list.
	a.mu.Lock()
	prev := a.reg.Info(e.GetEngineId())
	a.mu.Unlock()
	renewal := prev != nil
	// The router posts clients' prompts to base_url: it must name the
	// engine's own host (this machine), checked when it first registers or
	// names another URL (a renewal resolves nothing).
	if a.hosts.Local != nil && (!renewal || prev.GetBaseUrl() != e.GetBaseUrl()) {
		hctx, cancel := context.WithTimeout(ctx, hostCheckTimeout)
		err := a.hosts.Check(hctx, e.GetBaseUrl())
		cancel()
		if err != nil {
			return nil, api.Errorf(api.CodeBadRequest, "engine.register of %s on member %s: %v", e.GetEngineId(), a.member, err)
		}
	}
	if !renewal {
		if other := engineElsewhere(a.peers, a.member, e.GetEngineId()); other != "" {
			return nil, api.Errorf(api.CodeForbidden, "engine.register of %s on member %s: member %s serves an engine of that id; engine ids must be unique in the cluster",
				e.GetEngineId(), a.member, other)
		}
	}
	if advertise.ClampBlocks(e, a.blocks.EngineBlocks(e.GetEngineId())) {
		a.log.Debug("engine.register: blocks clamped to the engine's regions", "engine", e.GetEngineId(), "blocks_free", e.GetBlocksFree(), "blocks_total", e.GetBlocksTotal())
	}
	a.mu.Lock()
	replaced, lapsed, err := a.reg.Register(r.GetEngine(), ttl, a.clock.Now())
	if err == nil && a.registered != nil {
		close(a.registered)
		a.registered = nil
	}
	a.mu.Unlock()
	// A registration that makes room drops what lapsed: it is the first
	// reader then, and ends them as the loops would (the heartbeat is
	// updated below, or here when the registration itself was refused).
	a.endLapsed(lapsed)
	if err != nil && len(lapsed) > 0 {
		a.advertise()
	}
	if replaced != nil {
		a.log.Warn("engine restarted (a new instance registered): the previous instance's requests end", "engine", replaced.Engine, "instance", replaced.Instance)
		a.engineLost(*replaced)
	}
	if errors.Is(err, advertise.ErrFull) {
		return nil, api.Errorf(api.CodeOverloaded, "engine.register of %s on member %s: %v", r.GetEngine().GetEngineId(), a.member, err)
	}
	if err != nil {
		return nil, api.Errorf(api.CodeBadRequest, "%v", err)
	}
	a.advertise()
	return &messages.RegisterEngineReply{
		TtlMs: uint32(ttl.Milliseconds()), RenewMs: uint32((ttl / 3).Milliseconds()),
		NoticeSeq: a.journal.Last(r.GetEngine().GetEngineId()), NoticeJournal: a.journalID,
		// pull.start's await_start is honoured (startgate.go).
		PullAwaitsStart: true,
	}, nil
}

// drop forgets an engine's registration (engine.gone).
func (a *engineAPI) drop(id string) {
	a.mu.Lock()
	ended, removed := a.reg.Remove(id)
	a.mu.Unlock()
	a.journal.Forget(id) // it said goodbye: nobody will replay its notices
	if a.creds != nil {
		a.creds.forget(id)
	}
	if removed {
		a.advertise()
	}
	a.engineLost(ended)
}

// engineInstance is the instance id of engine id's live registration.
func (a *engineAPI) engineInstance(id string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reg.Instance(id)
}

// info is engine id's live registration (nil if none), a copy.
func (a *engineAPI) info(id string) *messages.EngineInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	if e := a.reg.Info(id); e != nil {
		return proto.CloneOf(e)
	}
	return nil
}

// wantsJSON reports whether engine's live registration asked for JSON
// notices.
func (a *engineAPI) wantsJSON(engine string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reg.Info(engine).GetJsonNotices()
}

// live is a copy of every live registration.
func (a *engineAPI) live() []*messages.EngineInfo {
	live := a.liveEnding()
	out := make([]*messages.EngineInfo, 0, len(live))
	for _, e := range live {
		out = append(out, proto.CloneOf(e))
	}
	return out
}

// engineLost ends, after engineLostGrace, the requests a departed engine
// ran here that no other engine took over (see actors.EngineLost):
// otherwise their actors would renew the prefill hold for nobody.
func (a *engineAPI) engineLost(ended advertise.Ended) {
	if a.requests == nil {
		return
	}
	a.clock.AfterFunc(engineLostGrace, func() {
		select {
		case <-a.stop:
			return
		default:
		}
		if ended.Instance != "" && a.engineInstance(ended.Engine) == ended.Instance {
			// The same process registered again within the grace: it was
			// paused (SIGSTOP, a long GC), not gone. Its requests go on, and
			// one it started since is not this departure's to end.
			a.log.Info("engine registered again after its registration lapsed: its requests go on", "engine", ended.Engine)
			return
		}
		a.requests.endEngine(ended.Engine, ended.Instance)
	})
}

// advertise puts the live registrations into this member's heartbeat. The
// read and the update are one step under advMu: two callers (a
// registration, the probe loop ending a lapse) cannot publish their reads
// in the other order and leave an older list in the heartbeat.
func (a *engineAPI) advertise() {
	a.advMu.Lock()
	defer a.advMu.Unlock()
	live, lapsed := a.takeLive()
	a.endLapsed(lapsed)
	if a.adv != nil {
		a.adv.SetEngines(live)
	}
}

// liveEnding returns the live registrations. Reading them drops those that
// lapsed, so whoever reads first (the expiry loop, the probe loop, a
// status call) ends them: logged, their requests ended after the grace,
// the heartbeat updated. A lapse is never dropped unnoticed.
func (a *engineAPI) liveEnding() []*messages.EngineInfo {
	live, lapsed := a.takeLive()
	if len(lapsed) > 0 {
		a.endLapsed(lapsed)
		a.advertise()
	}
	return live
}

// takeLive is the registry's live registrations now, and those that lapsed
// since the last read (dropped from the registry by this call).
func (a *engineAPI) takeLive() ([]*messages.EngineInfo, []advertise.Ended) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reg.Live(a.clock.Now())
}

// endLapsed ends the registrations that lapsed.
func (a *engineAPI) endLapsed(lapsed []advertise.Ended) {
	for _, e := range lapsed {
		a.log.Warn("engine registration lapsed (no renewal within its TTL): no longer advertised", "engine", e.Engine)
		a.engineLost(e)
	}
}

// untilRegisteredLocked returns a channel closed at the next registration when
// nothing is registered now, else nil. The caller holds a.mu.
func (a *engineAPI) untilRegisteredLocked() <-chan struct{} {
	if !a.reg.NextExpiry().IsZero() {
		return nil // something is registered (lapsed or not: the next read ends a lapse)
	}
	if a.registered == nil {
		a.registered = make(chan struct{})
	}
	return a.registered
}

// awaitRegistration blocks while nothing is registered, until a
// registration or stop; it reports false on stop.
func (a *engineAPI) awaitRegistration() bool {
	a.mu.Lock()
	ch := a.untilRegisteredLocked()
	a.mu.Unlock()
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	case <-a.stop:
		return false
	}
}

// expire drops lapsed registrations as they lapse, until stop.
func (a *engineAPI) expire() {
	t, tc := a.clock.NewTimer(time.Hour)
	defer t.Stop()
	for {
		if !a.awaitRegistration() {
			return
		}
		a.mu.Lock()
		next := a.reg.NextExpiry()
		a.mu.Unlock()
		wait := 250 * time.Millisecond
		if !next.IsZero() {
			if w := next.Sub(a.clock.Now()); w < wait {
				wait = max(w, time.Millisecond)
			}
		}
		t.Reset(wait)
		select {
		case <-a.stop:
			return
		case <-tc:
		}
		a.liveEnding()
	}
}
