package daemon

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/advertise"
	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// engineTable wires advertise.Registry to the API and to this member's
// heartbeats: every change (a new engine, a lapse, engine.gone) is
// advertised at once.
type engineTable struct {
	reg *advertise.Registry
}

// RegisterEngine registers or refreshes an engine with this member.
func (d *Daemon) RegisterEngine(ctx context.Context, r *messages.RegisterEngineRequest) (*messages.RegisterEngineReply, error) {
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
	if err := advertise.CheckRole(e.GetRole(), d.cfg.Role); err != nil {
		return nil, api.Errorf(api.CodeForbidden, "engine.register of %s on member %s: %v", e.GetEngineId(), d.cfg.MemberID, err)
	}
	if _, scoped := api.CallerEngine(ctx); scoped && natsAuthenticated(d.cfg) {
		if err := d.checkEngineCreds(ctx, e.GetEngineId(), e.GetRole(), e.GetModel()); err != nil {
			return nil, err
		}
	}
	if advertise.ClampBlocks(e, d.regions.EngineBlocks(e.GetEngineId())) {
		d.log.Debug("engine.register: blocks clamped to the engine's regions", "engine", e.GetEngineId(), "blocks_free", e.GetBlocksFree(), "blocks_total", e.GetBlocksTotal())
	}
	d.engMu.Lock()
	replaced, err := d.engines.reg.Register(r.GetEngine(), ttl, d.now())
	d.engMu.Unlock()
	if replaced != nil {
		d.log.Warn("engine restarted (a new instance registered): the previous instance's requests end", "engine", replaced.Engine, "instance", replaced.Instance)
		d.engineLost(*replaced)
	}
	if errors.Is(err, advertise.ErrFull) {
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
func (d *Daemon) engineLost(ended advertise.Ended) {
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

// engineProbeInterval is how often connexd tries a connection to each
// registered engine's HTTP port, and engineProbeTimeout how long one try
// may take. A refused try ends the engine's registration at once (see
// advertise.Liveness): a killed engine leaves membership within about one
// interval instead of its registration TTL (3 s), so the router stops
// picking it and its /ready turns 503 when the last one of a role goes.
const (
	engineProbeInterval = 250 * time.Millisecond
	engineProbeTimeout  = 500 * time.Millisecond
)

// probeEngines drops the registrations of engines whose process is gone.
func (d *Daemon) probeEngines() {
	defer d.wg.Done()
	live := advertise.NewLiveness()
	t, tc := d.clock.NewTimer(engineProbeInterval)
	defer t.Stop()
	dialer := &net.Dialer{Timeout: engineProbeTimeout}
	for {
		select {
		case <-d.stop:
			return
		case <-tc:
		}
		d.engMu.Lock()
		regs, _ := d.engines.reg.Live(d.now())
		d.engMu.Unlock()
		type outcome struct {
			id, instance string
			err          error
		}
		results := make(chan outcome, len(regs))
		n := 0
		for _, e := range regs {
			addr := dialAddr(e.GetBaseUrl())
			if addr == "" {
				continue
			}
			n++
			go func(id, instance string) {
				c, err := dialer.Dial("tcp", addr)
				if err == nil {
					_ = c.Close()
				}
				results <- outcome{id, instance, err}
			}(e.GetEngineId(), e.GetInstanceId())
		}
		registered := map[string]bool{}
		for _, e := range regs {
			registered[e.GetEngineId()] = true
		}
		live.Forget(func(id string) bool { return registered[id] })
		for range n {
			o := <-results
			switch live.Observe(o.id, o.instance, dialOutcome(o.err)) {
			case advertise.Listening:
				d.log.Info("engine listening: a refused connection to it from now on ends its registration at once", "engine", o.id)
				continue
			case advertise.Unchanged:
				continue
			}
			d.engMu.Lock()
			ended, removed := d.engines.reg.RemoveInstance(o.id, o.instance)
			d.engMu.Unlock()
			if !removed {
				continue
			}
			d.log.Warn("engine's HTTP port refuses connections (its process is gone): no longer advertised", "engine", o.id, "err", o.err)
			d.advertiseEngines()
			d.engineLost(ended)
		}
		t.Reset(engineProbeInterval)
	}
}
