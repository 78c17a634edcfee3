package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/engines"
	"github.com/connex/connex/messages"
)

// engineTable wires engines.Registry to the API and to this member's
// heartbeats: every change (a new engine, a lapse, engine.gone) is
// advertised at once.
type engineTable struct {
	reg *engines.Registry
}

// RegisterEngine registers or refreshes an engine with this member.
func (d *Daemon) RegisterEngine(ctx context.Context, r *messages.RegisterEngineRequest) (*messages.RegisterEngineReply, error) {
	if r.GetEngine() != nil {
		if err := acting(ctx, "engine.engine_id", &r.Engine.EngineId); err != nil {
			return nil, err
		}
	}
	ttl, err := engines.Validate(r, api.ValidToken)
	if err != nil {
		return nil, api.Errorf(api.CodeBadRequest, "%v", err)
	}
	e := r.GetEngine()
	// Nothing an engine says about itself is believed unchecked: its role
	// must be one this member hosts and its credentials allow, with a
	// model they allow; its blocks are at most those of its regions here.
	if err := engines.CheckRole(e.GetRole(), d.cfg.Role); err != nil {
		return nil, api.Errorf(api.CodeForbidden, "engine.register of %s on member %s: %v", e.GetEngineId(), d.cfg.MemberID, err)
	}
	if _, scoped := api.CallerEngine(ctx); scoped && natsAuthenticated(d.cfg) {
		if err := d.checkEngineCreds(ctx, e.GetEngineId(), e.GetRole(), e.GetModel()); err != nil {
			return nil, err
		}
	}
	if engines.ClampBlocks(e, d.regions.EngineBlocks(e.GetEngineId())) {
		d.log.Debug("engine.register: blocks clamped to the engine's regions", "engine", e.GetEngineId(), "blocks_free", e.GetBlocksFree(), "blocks_total", e.GetBlocksTotal())
	}
	d.engMu.Lock()
	replaced, err := d.engines.reg.Register(r.GetEngine(), ttl, d.now())
	d.engMu.Unlock()
	if replaced != nil {
		d.log.Warn("engine restarted (a new instance registered): the previous instance's requests end", "engine", replaced.Engine, "instance", replaced.Instance)
		d.engineLost(*replaced)
	}
	if errors.Is(err, engines.ErrFull) {
		return nil, api.Errorf(api.CodeOverloaded, "engine.register of %s on member %s: %v", r.GetEngine().GetEngineId(), d.cfg.MemberID, err)
	}
	if err != nil {
		return nil, api.Errorf(api.CodeBadRequest, "%v", err)
	}
	d.advertiseEngines()
	return &messages.RegisterEngineReply{
		TtlMs: uint32(ttl.Milliseconds()), RenewMs: uint32((ttl / 3).Milliseconds()),
		NoticeSeq: d.journal.Last(r.GetEngine().GetEngineId()), NoticeJournal: d.journalID,
	}, nil
}

// dropEngine forgets an engine's registration (engine.gone).
func (d *Daemon) dropEngine(id string) {
	d.engMu.Lock()
	ended, removed := d.engines.reg.Remove(id)
	d.engMu.Unlock()
	d.journal.Forget(id) // it said goodbye: nobody will replay its notices
	d.forgetEngineCreds(id)
	if removed {
		d.advertiseEngines()
	}
	d.engineLost(ended)
}

// engineInstance is the instance id of engine id's live registration.
func (d *Daemon) engineInstance(id string) string {
	d.engMu.Lock()
	defer d.engMu.Unlock()
	return d.engines.reg.Instance(id)
}

// engineLostGrace is how long after an engine left its requests wait for a takeover before they end: an engine that shuts down
// hands its streams back to the router (an error event) and says
// engine.gone at once, and the router's resume must win that race.
const engineLostGrace = 2 * time.Second

// engineLost ends, after engineLostGrace, the requests a departed engine
// ran here that no other engine took over (see
// actors.EngineLost): otherwise their actors would renew the prefill hold
// for nobody.
func (d *Daemon) engineLost(ended engines.Ended) {
	if d.system == nil || d.reqTable == nil {
		return
	}
	d.clock.AfterFunc(engineLostGrace, func() {
		select {
		case <-d.stop:
			return
		default:
		}
		if ended.Instance != "" && d.engineInstance(ended.Engine) == ended.Instance {
			// The same process registered again within the grace: it was
			// paused (SIGSTOP, a long GC), not gone. Its requests go on, and
			// one it started since is not this departure's to end.
			d.log.Info("engine registered again after its registration lapsed: its requests go on", "engine", ended.Engine)
			return
		}
		for _, pid := range d.reqTable.All() {
			d.system.Root.Send(pid, &actors.EngineLost{Engine: ended.Engine, Instance: ended.Instance})
		}
	})
}

// advertiseEngines puts the live registrations into this member's heartbeat.
func (d *Daemon) advertiseEngines() {
	d.engMu.Lock()
	live, lapsed := d.engines.reg.Live(d.now())
	d.engMu.Unlock()
	for _, e := range lapsed {
		d.log.Warn("engine registration lapsed (no renewal within its TTL): no longer advertised", "engine", e.Engine)
		d.engineLost(e)
	}
	if d.cluster != nil {
		d.cluster.SetEngines(live)
	}
}

// expireEngines drops lapsed registrations as they lapse.
func (d *Daemon) expireEngines() {
	defer d.wg.Done()
	t, tc := d.clock.NewTimer(time.Hour)
	defer t.Stop()
	for {
		d.engMu.Lock()
		next := d.engines.reg.NextExpiry()
		d.engMu.Unlock()
		wait := 250 * time.Millisecond
		if !next.IsZero() {
			if w := next.Sub(d.now()); w < wait {
				wait = max(w, time.Millisecond)
			}
		}
		t.Reset(wait)
		select {
		case <-d.stop:
			return
		case <-tc:
		}
		d.engMu.Lock()
		_, lapsed := d.engines.reg.Live(d.now())
		d.engMu.Unlock()
		if len(lapsed) > 0 {
			for _, e := range lapsed {
				d.log.Warn("engine registration lapsed (no renewal within its TTL): no longer advertised", "engine", e.Engine)
				d.engineLost(e)
			}
			d.advertiseEngines()
		}
	}
}
