// Package daemon assembles connexd: NATS, the data plane, the actor system,
// the region table and the subject API. cmd/connexd and tests start it with
// New and stop it with Close.
package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/actors"
	"github.com/connex/connex/advertise"
	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/cluster"
	"github.com/connex/connex/config"
	"github.com/connex/connex/errcode"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/handover"
	"github.com/connex/connex/kvmem/regionfile"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/natsbus"
	"github.com/connex/connex/notices"
	"github.com/connex/connex/pull"
	"github.com/connex/connex/requests"
	"github.com/connex/connex/router"
	"github.com/connex/connex/transport"
	"github.com/connex/connex/transport/ucx"
	"github.com/nats-io/nats.go/micro"
)

// Version is reported by the micro service.
const Version = "0.1.0"

// Daemon is one running connexd: the assembly of the concerns that answer
// the subject API (handler.go) over NATS, the data plane and the actor
// system it starts.
type Daemon struct {
	cfg     config.Config
	log     *slog.Logger
	Bus     *natsbus.Bus
	Backend transport.Backend
	system  *actor.ActorSystem
	holds   *actor.PID
	dir     *actors.HoldTable
	regions *kvmem.RegionTable
	// handover serves created regions' descriptors to their engines
	// (region_socket); nil when off or on a router.
	handover *handover.Server
	svc      micro.Service
	Metrics  *actors.Metrics
	hdeps    *actors.HoldDeps
	pdeps    *pull.PullDeps
	// Request actors (decode side).
	reqTable *actors.RequestTable
	reqStore *requests.KVStore
	reqErr   error // why reqStore is nil
	rdeps    *actors.RequestDeps
	members  Members
	started  time.Time
	// journal numbers and keeps the notices to each engine (engine.notices);
	// journalID is fresh per start. inflight lists running pulls.
	journal   *notices.Journal
	journalID string
	inflight  *pullTable
	// The concerns answering the API (handler.go), each over narrow
	// interfaces that New wires.
	regionAPI *regionAPI
	holdAPI   *holdAPI
	pullAPI   *pullAPI
	// headAhead reads a granted takeover's request ahead of its start.
	headAhead *headAhead
	// starts lets pulls wait for their request's start (await_start).
	starts     *startGate
	requestAPI *requestAPI
	engineAPI  *engineAPI
	cluster    *clusterMembers
	clock      clock.Clock // the time and timers of everything below (WithClock)
	stop       chan struct{}
	wg         sync.WaitGroup
	closed     sync.Once
	// bg tracks pullers' reads and background PullEnds; Close waits for
	// them (cancelled reads end within a grain or the cancel grace, each
	// PullEnd within pull_stall_ms) before the data plane and NATS close.
	bgMu     sync.Mutex
	bgClosed bool
	bg       sync.WaitGroup
	// prom is the Prometheus view (metrics_listen), nil when off.
	prom *promMetrics
	// pprof serves Go's profiles (pprof_listen; nil when off).
	pprof *profiles
	// engView is the router's engine list, built once per view generation.
	engView engineView
	// activity tells membership whether this member has work in hand, so
	// that it heartbeats at the preset's idle interval only when it has
	// none (workInHand, and a Touch per hold, pull, request and routed
	// completion).
	activity *cluster.Activity
	// routing counts the completions the router is serving (role router).
	routing atomic.Int64
	// Router is the OpenAI-compatible front door (role router), else nil.
	Router *router.Server
	// stopping turns protoactor's shutdown-time errors into info lines
	// (libHandler); set when Close begins.
	stopping atomic.Bool
	libLog   *slog.Logger
	// pullCancel aborts every pull's reads on Close.
	pullCancel context.CancelFunc
}

// ClockSkewEnv names an environment variable, for fault tests only, that
// shifts the wall clock this member's holds, leases, request states and
// pull records read (a Go duration: "-30s"), to show that nothing depends
// on members' clocks agreeing. Membership and timers use the monotonic
// clock and are not shifted.
const ClockSkewEnv = "CONNEX_FAULT_CLOCK_SKEW"

// New starts a daemon. On error everything started so far is stopped.
func New(cfg config.Config, log *slog.Logger, opts ...Option) (d *Daemon, err error) {
	if log == nil {
		log = slog.Default()
	}
	d = &Daemon{cfg: cfg, log: log, clock: clock.Real{}, Metrics: &actors.Metrics{}, stop: make(chan struct{})}
	d.activity = cluster.NewActivity(d.workInHand)
	for _, o := range opts {
		o(d)
	}
	d.started = d.now()
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if _, system := d.clock.(clock.Real); system && os.Getenv(ClockSkewEnv) != "" {
		v := os.Getenv(ClockSkewEnv)
		skew, err := time.ParseDuration(v)
		if err != nil {
			return d, fmt.Errorf("%s=%q: %w (want a Go duration such as -30s)", ClockSkewEnv, v, err)
		}
		// clock.Skewed keeps the monotonic reading: durations and timers
		// are as before, only wall-clock readings move, as on a host whose
		// clock is off.
		d.clock = clock.Skewed{Skew: skew}
		log.Warn("this member's wall clock is shifted for a fault test", "env", ClockSkewEnv, "skew", skew)
	}
	if cfg.ShmDir != "" {
		pages, err := regionfile.ShmDirPages(cfg.ShmDir)
		if err != nil {
			return d, err
		}
		if pages != "2MiB" {
			log.Warn("shm_dir gives created regions 4 KiB pages; mount a tmpfs with huge=always there for 2 MiB pages", "shm_dir", cfg.ShmDir)
		}
	}
	var creds []byte
	d.Bus, creds, err = openBus(cfg, log)
	if err != nil {
		return d, err
	}
	remoteOpts, err := remoteOptions(cfg, creds, log)
	if err != nil {
		return d, err
	}
	tcfg, err := dataTLS(cfg, creds)
	if err != nil {
		return d, err
	}
	d.Backend, err = OpenBackend(BackendConfig{
		Name:    cfg.Backend,
		Options: transport.Options{ListenAddr: cfg.DataListen, Logger: log},
		UCX:     ucx.Config{Reads: cfg.UCXReads, SharedReads: cfg.UCXSharedReads, ShmDir: cfg.ShmDir},
		TCP:     tcfg,
	})
	if err != nil {
		return d, err
	}
	if tcfg.ServerTLS != nil && d.Backend.Name() != "tcp" && (cfg.DataTLS == "on" || cfg.NATSTLSCert != "") {
		log.Warn("data_tls applies to the TCP data plane only: this member's data plane is "+d.Backend.Name()+", whose traffic between hosts is not encrypted", "backend", d.Backend.Name())
	}
	rdir, err := regionfile.OpenDir(cfg.RegionDir, cfg.RegionOwners)
	if err != nil {
		return d, err
	}
	d.regions = kvmem.NewRegionTable(rdir)
	q := kvmem.Quota{MemberBytes: cfg.RegionMaxBytes, EngineBytes: cfg.RegionMaxBytesPerEngine, RegionsPerEngine: cfg.RegionMaxPerEngine}
	if q.MemberBytes == 0 {
		if total, err := regionfile.Meminfo("MemTotal"); err == nil {
			q.MemberBytes = total / 4 * 3
		}
	}
	if q.EngineBytes == 0 {
		q.EngineBytes = q.MemberBytes
	}
	d.regions.SetQuota(q)
	d.regionAPI = &regionAPI{table: d.regions, alloc: regionAllocator{backend: d.Backend, shmDir: cfg.ShmDir, log: log}, log: log}
	if cfg.RegionSocket != "off" && cfg.Role != "router" {
		d.handover, err = handover.Listen(handover.Options{Addr: cfg.RegionSocket, Open: d.regionAPI.openCreated, Log: log})
		if err != nil {
			return d, fmt.Errorf("region_socket: %w", err)
		}
		d.regionAPI.grants = d.handover
	}
	if d.Backend.Caps().GuardFaults {
		// The data plane copies region memory outside Go: a region whose
		// file an engine shrinks must break, not kill connexd.
		fg, err := transport.Promised[transport.FaultGuard](d.Backend, "GuardFaults")
		if err != nil {
			return d, err
		}
		d.regions.SetGuard(func(mem []byte) (kvmem.Guard, error) { return fg.Guard(mem) })
	}
	d.journal, d.journalID, d.inflight = notices.NewJournal(noticeJournalLimit, cfg.Tombstone), actors.NewTransferID()[:16], newPullTable()
	d.dir = actors.NewHoldTable(cfg.Tombstone, d.clock)
	d.libLog = slog.New(libHandler{Handler: log.Handler(), stopping: &d.stopping})
	d.system = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return d.libLog.With("lib", "protoactor")
	}))
	ctrl := &messages.RemoteCtrl{Member: cfg.MemberID, Backend: d.Backend.Name(), DataAddr: d.Backend.Address()}
	if cfg.DataAdvertise != "" && d.Backend.Name() == "tcp" {
		ctrl.DataAddr = []byte(cfg.DataAdvertise)
	}
	d.hdeps = &actors.HoldDeps{
		Backend: d.Backend, Ctrl: ctrl, Dir: d.dir, Clock: d.clock, Log: log, Metrics: d.Metrics,
		ReadSlack: time.Second,
		Notify: func(m *messages.BlocksFreed) {
			if d.prom != nil {
				d.prom.blocksFreed(m)
			}
			d.publish(api.FreedSubject(cfg.MemberID, m.EngineId), m)
		},
	}
	d.pdeps = &pull.PullDeps{
		Backend: d.Backend, NC: d.Bus.Conn, Clock: d.clock, Log: log, Metrics: d.Metrics,
		LoadFailurePolicy: cfg.KVLoadFailurePolicy,
		Notify: func(m *messages.PullDone) {
			d.inflight.done(m.PullId, d.now())
			if d.prom != nil {
				d.prom.pullDone(m)
			}
			d.publish(api.PullDoneSubject(cfg.MemberID, m.EngineId), m)
		},
		Go:      d.goBackground,
		Holders: &pull.HolderWatch{},
	}
	d.pdeps.Ctx, d.pullCancel = context.WithCancel(context.Background())
	d.reqTable = actors.NewRequestTable()
	d.reqStore, d.reqErr = openRequestStore(d.Bus.Conn, cfg, log)
	if d.reqErr != nil {
		d.reqStore = nil
		log.Warn("JetStream unavailable: the request API (request.*) is disabled", "err", d.reqErr)
	}
	var actorStore requests.Store
	if d.reqStore != nil {
		// The request actors' reads: a takeover's head read when its
		// grant arrived (GrantTakeover).
		d.headAhead = &headAhead{Store: d.reqStore, Clock: d.clock, Go: d.goBackground, Timeout: 5 * time.Second}
		actorStore = d.headAhead
	}
	d.rdeps = &actors.RequestDeps{
		Store: actorStore, NC: d.Bus.Conn, Self: cfg.MemberID, Clock: d.clock, Log: log, Table: d.reqTable,
		Publish: d.publish, StoreTimeout: 5 * time.Second, LoadFailurePolicy: cfg.KVLoadFailurePolicy,
		Metrics: d.Metrics, PromptRefresh: cfg.RequestTTL / requests.PromptRefreshDiv,
	}
	d.assemble()
	if cfg.MetricsListen != "" {
		d.prom = newPromMetrics(d)
		if err := d.prom.serve(cfg.MetricsListen, d); err != nil {
			return d, err
		}
		d.requestAPI.adopted = d.prom.failover.Observe
	}
	if cfg.PprofListen != "" {
		if d.pprof, err = serveProfiles(cfg.PprofListen, log); err != nil {
			return d, err
		}
	}
	d.holds, err = d.system.Root.SpawnNamed(actors.HoldSupervisorProps(d.hdeps), "holds")
	if err != nil {
		return d, fmt.Errorf("spawn hold supervisor: %w", err)
	}
	d.holdAPI.actors = systemHolds{sys: d.system, table: d.holds}
	d.svc, err = api.Serve(d.Bus.Conn, handler{d}, api.ServeOptions{
		Member: cfg.MemberID, Version: Version, MaxRequestBytes: cfg.MaxRequestBytes, Logger: log,
		Stats: d.stats, Errors: errcode.AsError, EngineInbox: engineInbox(cfg),
	})
	if err != nil {
		return d, err
	}
	if d.reqStore != nil {
		cm, err := joinCluster(d.Bus.Conn, cfg, remoteOpts, d.activity, log, d.libLog)
		if err != nil {
			return d, err
		}
		d.cluster, d.members = cm, cm
		d.requestAPI.members, d.engineAPI.adv, d.engineAPI.peers = cm, cm, cm
		// A holder that leaves the cluster (crashed: its NATS connection
		// is gone) ends the pulls reading from it now, not at the stall
		// deadline: UCX's shared-memory lanes report no peer death.
		d.hdeps.Incarnation = cm.SelfID
		cm.OnLeft(func(name, id string, reason cluster.Reason) {
			if d.prom != nil {
				d.prom.departed.WithLabelValues(string(reason)).Inc()
			}
			if d.pdeps.Holders.Running() == 0 {
				return
			}
			// Off the membership goroutine: a member can leave the view
			// while its process lives (an eviction and rejoin under a new
			// cluster id shuts the old incarnation down); its data plane is
			// then intact, and only a holder whose API is gone (or frozen)
			// ends the pulls reading from it.
			d.goBackground(func() {
				if d.holderAnswers(name) {
					log.Info("holder left the cluster view but its API answers; its pulls carry on", "member", name, "id", id, "reason", reason)
					return
				}
				if n := d.pdeps.Holders.LeftIncarnation(name, id, string(reason)); n > 0 {
					log.Warn("holder left the cluster during pulls; they end now", "member", name, "id", id, "reason", reason, "pulls", n)
				}
			})
		})
		d.startCoordinator(cfg.OrphanScan, cfg.OrphanIdleScan)
	}
	if cfg.Role == "router" {
		if err := d.startRouter(); err != nil {
			return d, err
		}
	}
	// Make sure the server has our subscriptions before anyone is told we
	// are ready (a request right after the ready line must find us).
	if err := d.Bus.Conn.FlushTimeout(10 * time.Second); err != nil {
		log.Warn("nats flush after start failed; the API may answer late", "err", err)
	}
	d.wg.Add(3)
	go d.sweep()
	go func() {
		defer d.wg.Done()
		d.engineAPI.expire()
	}()
	go func() {
		defer d.wg.Done()
		d.engineAPI.probe()
	}()
	return d, nil
}

// assemble builds the concerns that answer the API and wires each to the
// narrow interfaces it needs: the actor system's holds and requests, the
// region table, the request store. The hold supervisor's pid and membership
// are wired once they exist (New).
func (d *Daemon) assemble() {
	cfg := d.cfg
	d.holdAPI = &holdAPI{cfg: cfg, dir: d.dir, regions: d.regions, log: d.log}
	d.starts = newStartGate(d.clock)
	d.pullAPI = &pullAPI{backend: d.Backend.Name(), timeout: cfg.PullTimeout, stall: cfg.PullStall,
		regions: d.regions, pullers: newPullDeps(d.pdeps), inflight: d.inflight, starts: d.starts, clock: d.clock}
	d.requestAPI = &requestAPI{member: cfg.MemberID, max: cfg.RequestsMax, authenticated: natsAuthenticated(cfg),
		actors: systemRequests{sys: d.system, table: d.reqTable, deps: d.rdeps}, storeErr: d.reqErr,
		local: d.regions, clock: d.clock, starts: d.starts, headAhead: d.headAhead, tryBackground: d.tryBackground, log: d.log,
		quota: &requests.Quota{MaxRequests: cfg.RequestsMaxPerEngine, MaxBytes: cfg.RequestBytesPerEngine, MaxMemberBytes: cfg.RequestStoreBytes / 2}}
	d.requestAPI.reservations = pullReservations{deps: d.pdeps, regions: d.regions, timeout: cfg.PullTimeout}
	if d.reqStore != nil {
		d.requestAPI.store = d.reqStore
		d.holdAPI.binder = &requestBinder{holds: d.holdAPI, store: d.reqStore, log: d.log}
	}
	d.engineAPI = &engineAPI{member: cfg.MemberID, role: cfg.Role, authenticated: natsAuthenticated(cfg),
		reg: advertise.NewRegistry(), creds: &engineCreds{nc: d.Bus.Conn, member: cfg.MemberID, clock: d.clock},
		blocks: d.regions, journal: d.journal, journalID: d.journalID, requests: d.requestAPI,
		hosts: ownHost(cfg.EngineURLHosts), clock: d.clock, stop: d.stop, log: d.log}
	d.requestAPI.instances = d.engineAPI
}

// MetricsURL is where Prometheus metrics are served ("" when metrics_listen is empty).
func (d *Daemon) MetricsURL() string { return d.prom.URL() }

// PprofURL is where Go's profiles are served (pprof_listen; "" when off):
// with port 0 in pprof_listen, the port the system picked.
func (d *Daemon) PprofURL() string { return d.pprof.URL() }

// MemberID is this daemon's member id.
func (d *Daemon) MemberID() string { return d.cfg.MemberID }

// sweep forgets ended holds' tombstones, once a minute.
func (d *Daemon) sweep() {
	defer d.wg.Done()
	t, tc := d.clock.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-tc:
			d.dir.Sweep()
		}
	}
}

// Close stops the API, frees every hold (engines are told), stops pulls,
// closes the data plane and NATS. Idempotent.
func (d *Daemon) Close() {
	d.closed.Do(func() {
		d.stopping.Store(true)
		d.stopRouter()
		if d.svc != nil {
			_ = d.svc.Stop()
		}
		if d.pullCancel != nil {
			// Running pulls end now with transfer_failed (canceled): the
			// engines hear it and the holders get their PullEnd while NATS
			// is still up; Close waits for both below.
			d.pullCancel()
		}
		if d.pdeps != nil {
			// Unused reservations end their reads while NATS is up.
			d.pdeps.CloseReservations()
		}
		if d.starts != nil {
			// Pulls waiting for their request's start end too, their
			// blocks given back, their engines told.
			d.starts.close()
		}
		close(d.stop)
		if d.cluster != nil {
			d.cluster.Close()
		}
		if d.system != nil {
			for id, e := range d.dir.All() {
				if e.Quarantined.Load() {
					continue // ended already; its blocks stay held for good
				}
				if _, err := d.system.Root.RequestFuture(e.PID, &actors.Shutdown{}, 5*time.Second).Result(); err != nil {
					d.log.Warn("hold did not stop cleanly", "transfer", id, "err", err)
				}
			}
			d.system.Shutdown()
		}
		d.bgMu.Lock()
		d.bgClosed = true
		d.bgMu.Unlock()
		d.bg.Wait()
		d.wg.Wait()
		d.prom.close()
		d.pprof.close()
		if d.Backend != nil {
			_ = d.Backend.Close()
		}
		if d.handover != nil {
			if err := d.handover.Close(); err != nil {
				d.log.Warn("region socket did not close cleanly", "err", err)
			}
		}
		if d.regions != nil {
			d.regions.Close()
		}
		if d.Bus != nil {
			d.Bus.Close()
		}
		if d.Metrics != nil {
			d.log.Info("connexd stopped", "metrics", d.Metrics.Snapshot())
		}
	})
}

// goBackground runs f on a goroutine that Close waits for; once Close has
// begun waiting, f runs on the caller's goroutine instead.
func (d *Daemon) goBackground(f func()) {
	d.bgMu.Lock()
	if d.bgClosed {
		d.bgMu.Unlock()
		f()
		return
	}
	d.bg.Add(1)
	d.bgMu.Unlock()
	go func() {
		defer d.bg.Done()
		f()
	}()
}

// tryBackground runs f on a goroutine that Close waits for, and reports
// true; once connexd is stopping it runs nothing and reports false (work
// that only saves time, not work that must be done).
func (d *Daemon) tryBackground(f func()) bool {
	d.bgMu.Lock()
	defer d.bgMu.Unlock()
	if d.bgClosed || d.stopping.Load() {
		return false
	}
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		f()
	}()
	return true
}

// stats is the daemon's counters and gauges, served in $SRV.STATS.connex.
func (d *Daemon) stats() any {
	m := d.Metrics.Snapshot()
	m["holds_live"] = int64(d.dir.Live())
	m["requests_live"] = int64(d.reqTable.Len())
	return m
}

// holderAnswers reports whether member's API answers within a few
// heartbeats: a killed holder's NATS connection is gone, which NATS says at
// once (no responders); a frozen one does not answer in time.
func (d *Daemon) holderAnswers(member string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
	defer cancel()
	_, err := (&api.Client{NC: d.Bus.Conn, Member: member}).Inspect(ctx, &messages.HoldRef{TransferId: strings.Repeat("0", 32)})
	switch api.CodeOf(err) {
	case api.CodePeerUnavailable, api.CodeTimeout:
		return false
	}
	return true
}

// workInHand reports whether this member has work that lasts going on: a
// hold not yet freed, a pull not yet done, a completion being routed. Its
// membership heartbeats at the full rate meanwhile (cluster.Activity).
func (d *Daemon) workInHand() bool {
	m := d.Metrics
	return m.HoldsCreated.Load() > m.HoldsFreed.Load() ||
		m.PullsStarted.Load() > m.PullsOK.Load()+m.PullsFailed.Load() ||
		d.routing.Load() > 0
}
