package daemon

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	actorcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/connex/connex/cluster"
	"github.com/connex/connex/config"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
	"github.com/nats-io/nats.go"
)

// clusterMembers runs this member's protoactor cluster membership over NATS
// and adapts it to Members. The cluster has an ActorSystem of its own,
// separate from the one hosting holds, pullers and requests: protoactor
// blocks a removed member id for good, so a member evicted after a pause
// rejoins with a fresh ActorSystem without disturbing its work actors.
type clusterMembers struct {
	nc     *nats.Conn
	cfg    config.Config
	act    *cluster.Activity     // shared by the providers of every (re)join
	remote cluster.RemoteOptions // TLS and logger of protoactor's remote
	log    *slog.Logger
	libLog *slog.Logger // for protoactor (see libHandler)

	mu       sync.Mutex
	sys      *actor.ActorSystem
	cl       *actorcluster.Cluster
	prov     *cluster.Provider
	watchers []func(*cluster.Provider, cluster.Event) // re-subscribed to each provider on rejoin
	cancels  []func()
	load     int64
	engines  []*messages.EngineInfo
	closed   bool
	roster   *memberRoster // departures and tenures by name, and the view built from them

	rejoins chan struct{}
	done    chan struct{}
}

func presetConfig(name string) cluster.Config {
	switch name {
	case "local":
		return cluster.DefaultLocalConfig()
	case "wan":
		return cluster.DefaultWANConfig()
	}
	return cluster.DefaultLANConfig()
}

func clusterRole(role string) cluster.Role {
	switch role {
	case "prefill":
		return cluster.RolePrefill
	case "router":
		return cluster.RoleRouter
	}
	return cluster.RoleDecode // decode and all host request actors
}

// joinCluster starts membership and keeps it: on self-eviction it rejoins.
func joinCluster(nc *nats.Conn, cfg config.Config, ro cluster.RemoteOptions, act *cluster.Activity, log, libLog *slog.Logger) (*clusterMembers, error) {
	m := &clusterMembers{nc: nc, cfg: cfg, act: act, remote: ro, log: log, libLog: libLog, rejoins: make(chan struct{}, 1), done: make(chan struct{}),
		roster: newMemberRoster(cfg.MemberID, presetConfig(cfg.ClusterPreset).SettleAfter(), time.Now)}
	if err := m.start(); err != nil {
		return nil, err
	}
	go m.rejoinLoop(m.start, rejoinRetryMin, rejoinRetryMax)
	return m, nil
}

func (m *clusterMembers) start() error {
	ccfg := presetConfig(m.cfg.ClusterPreset)
	ccfg.Role = clusterRole(m.cfg.Role)
	ccfg.Name = m.cfg.MemberID
	ccfg.Activity = m.act
	ccfg.Logger = m.log.With("component", "cluster")
	prov, err := cluster.NewProvider(m.nc, ccfg)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return m.libLog.With("lib", "protoactor-cluster")
	}))
	cl := actorcluster.New(sys, cluster.ActorClusterConfig(m.cfg.ClusterName, prov, disthash.New(), cluster.NewRemoteConfig(m.cfg.ClusterHost, 0, m.remote)))
	if err := cluster.StartMember(cl, prov); err != nil {
		return err // StartMember stopped what it began
	}
	// A (re)join starts from a clean slate: what a paused member believed
	// about departures and ages is stale.
	m.roster.rejoin()
	// Subscribe outside m.mu: Subscribe replays the live members to the
	// callback at once, and track takes m.mu.
	cancels := []func(){prov.Subscribe(m.track)}
	m.mu.Lock()
	if m.closed {
		// Close ran while this (re)join started: it found no provider to
		// stop, so leave now rather than linger as a member nobody stops.
		m.mu.Unlock()
		cancels[0]()
		cluster.StopMember(cl, prov)
		return nil
	}
	m.sys, m.cl, m.prov = sys, cl, prov
	prov.SetLoad(m.load)
	prov.SetEngines(m.engines)
	watchers := append([]func(*cluster.Provider, cluster.Event){}, m.watchers...)
	m.mu.Unlock()
	for _, fn := range watchers {
		cancels = append(cancels, m.subscribe(prov, fn))
	}
	m.mu.Lock()
	if m.prov != prov {
		// Stopped meanwhile (Close, or an eviction's rejoin): its
		// subscriptions go with it.
		m.mu.Unlock()
		for _, c := range cancels {
			c()
		}
		return nil
	}
	m.cancels = append(m.cancels, cancels...)
	m.mu.Unlock()
	return nil
}

func (m *clusterMembers) subscribe(prov *cluster.Provider, fn func(*cluster.Provider, cluster.Event)) func() {
	return prov.Subscribe(func(e cluster.Event) {
		if e.Type == cluster.EventSelfEvicted {
			select {
			case m.rejoins <- struct{}{}:
			default:
			}
		}
		fn(prov, e)
	})
}

// rejoinLoop rejoins the cluster with start after each eviction, and
// again after retryMin, doubling up to retryMax, while start fails.
func (m *clusterMembers) rejoinLoop(start func() error, retryMin, retryMax time.Duration) {
	retry := retryMin
	for {
		select {
		case <-m.done:
			return
		case <-m.rejoins:
		}
		m.log.Warn("this member was evicted from the cluster (was it paused?); rejoining with a new id")
		m.stopCurrent(false)
		for {
			err := start()
			if err == nil {
				retry = retryMin
				break
			}
			// Out of the cluster until a rejoin succeeds: no eviction
			// will come to ask again, so try again, less often each time.
			m.log.Error("rejoin failed; trying again", "err", err, "in", retry)
			select {
			case <-m.done:
				return
			case <-time.After(retry):
			}
			retry = min(2*retry, retryMax)
		}
	}
}

// The first retry of a failed rejoin and the longest wait between two.
const (
	rejoinRetryMin = 500 * time.Millisecond
	rejoinRetryMax = 30 * time.Second
)

func (m *clusterMembers) stopCurrent(graceful bool) {
	m.mu.Lock()
	prov, cl, sys := m.prov, m.cl, m.sys
	for _, c := range m.cancels {
		c()
	}
	m.cancels = nil
	m.prov, m.cl, m.sys = nil, nil, nil
	m.mu.Unlock()
	if prov == nil {
		return
	}
	if graceful {
		cluster.StopMember(cl, prov)
	} else {
		_ = prov.Shutdown(false)
		sys.Shutdown()
		cl.Remote.Shutdown(false)
	}
}

// LiveDecode implements Members: live decode members by name, suspects excluded.
func (m *clusterMembers) LiveDecode() []requests.Candidate {
	return decodeCandidates(m.Members())
}

// View implements Members: the roster of the names in the view now.
func (m *clusterMembers) View() requests.View {
	return m.roster.view(m.Members())
}

// DepartedAt is when this member saw name leave (zero if it has not, or
// came back since).
func (m *clusterMembers) DepartedAt(name string) time.Time {
	return m.roster.departedAt(name)
}

// track feeds the membership events to the roster.
func (m *clusterMembers) track(e cluster.Event) {
	m.roster.observe(e)
}

// OnChange implements Members.
func (m *clusterMembers) OnChange(fn func()) func() {
	return m.watch(func(*cluster.Provider, cluster.Event) { fn() })
}

// OnLeft calls fn with a member's name, its cluster id (the incarnation
// that left) and the reason when it leaves the cluster and no live member
// carries that name any more: a departure reported late (a dead notice or
// protoactor's block arriving after the member restarted, or rejoined with
// a new id after an eviction) is not the live incarnation's. fn runs on the
// membership goroutine and must return quickly.
func (m *clusterMembers) OnLeft(fn func(name, id string, reason cluster.Reason)) {
	m.watch(func(prov *cluster.Provider, e cluster.Event) {
		if leftForGood(e, m.cfg.MemberID, prov.Members()) {
			fn(e.Member.Name, e.Member.ID, e.Reason)
		}
	})
}

// SelfID is this member's cluster id now ("" between an eviction and the
// rejoin): a fresh one each time it joins.
func (m *clusterMembers) SelfID() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.prov == nil {
		return ""
	}
	return m.prov.SelfID()
}

// watch subscribes fn to the current provider's events and to every
// provider a rejoin starts.
func (m *clusterMembers) watch(fn func(*cluster.Provider, cluster.Event)) func() {
	m.mu.Lock()
	m.watchers = append(m.watchers, fn)
	prov := m.prov
	m.mu.Unlock()
	if prov != nil {
		c := m.subscribe(prov, fn)
		m.mu.Lock()
		m.cancels = append(m.cancels, c)
		m.mu.Unlock()
	}
	return func() {}
}

// SetLoad implements Members.
func (m *clusterMembers) SetLoad(load int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.load = load
	if m.prov != nil {
		m.prov.SetLoad(load)
	}
}

// SetEngines advertises the engines registered with this member.
func (m *clusterMembers) SetEngines(es []*messages.EngineInfo) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.engines = es
	if m.prov != nil {
		m.prov.SetEngines(es)
	}
}

// Members is every live member, suspects included, as of now.
func (m *clusterMembers) Members() []cluster.Member {
	m.mu.Lock()
	prov := m.prov
	m.mu.Unlock()
	if prov == nil {
		return nil
	}
	return prov.Members()
}

// generation is the current provider and its view generation
// (cluster.Provider.Generation); nil between an eviction and the rejoin.
func (m *clusterMembers) generation() (*cluster.Provider, uint64) {
	m.mu.Lock()
	prov := m.prov
	m.mu.Unlock()
	if prov == nil {
		return nil, 0
	}
	return prov, prov.Generation()
}

// Close leaves the cluster gracefully (the others see a leave at once).
func (m *clusterMembers) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	m.mu.Unlock()
	close(m.done)
	m.stopCurrent(true)
}
