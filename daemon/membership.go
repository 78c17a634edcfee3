package daemon

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	actorcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/connex/connex/cluster"
	"github.com/connex/connex/config"
	"github.com/connex/connex/requests"
	"github.com/nats-io/nats.go"
)

// clusterMembers runs this member's protoactor cluster membership over NATS
// and adapts it to Members. The cluster has an ActorSystem of its own,
// separate from the one hosting holds, pullers and requests: protoactor
// blocks a removed member id for good, so a member evicted after a pause
// rejoins with a fresh ActorSystem without disturbing its work actors.
type clusterMembers struct {
	nc  *nats.Conn
	cfg config.Config
	log *slog.Logger

	mu       sync.Mutex
	sys      *actor.ActorSystem
	cl       *actorcluster.Cluster
	prov     *cluster.Provider
	watchers []func()
	cancels  []func()
	load     int64
	closed   bool
	rejoins  chan struct{}
	done     chan struct{}
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
func joinCluster(nc *nats.Conn, cfg config.Config, log *slog.Logger) (*clusterMembers, error) {
	m := &clusterMembers{nc: nc, cfg: cfg, log: log, rejoins: make(chan struct{}, 1), done: make(chan struct{})}
	if err := m.start(); err != nil {
		return nil, err
	}
	go m.rejoinLoop()
	return m, nil
}

func (m *clusterMembers) start() error {
	ccfg := presetConfig(m.cfg.ClusterPreset)
	ccfg.Role = clusterRole(m.cfg.Role)
	ccfg.Name = m.cfg.MemberID
	ccfg.Logger = m.log.With("component", "cluster")
	prov, err := cluster.NewProvider(m.nc, ccfg)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return m.log.With("lib", "protoactor-cluster")
	}))
	cl := actorcluster.New(sys, actorcluster.Configure(m.cfg.ClusterName, prov, disthash.New(), cluster.NewRemoteConfig(m.cfg.ClusterHost, 0)))
	cl.StartMember()
	m.mu.Lock()
	m.sys, m.cl, m.prov = sys, cl, prov
	prov.SetLoad(m.load)
	for _, fn := range m.watchers {
		m.cancels = append(m.cancels, m.subscribe(prov, fn))
	}
	m.mu.Unlock()
	return nil
}

func (m *clusterMembers) subscribe(prov *cluster.Provider, fn func()) func() {
	return prov.Subscribe(func(e cluster.Event) {
		if e.Type == cluster.EventSelfEvicted {
			select {
			case m.rejoins <- struct{}{}:
			default:
			}
		}
		fn()
	})
}

func (m *clusterMembers) rejoinLoop() {
	for {
		select {
		case <-m.done:
			return
		case <-m.rejoins:
		}
		m.log.Warn("this member was evicted from the cluster (was it paused?); rejoining with a new id")
		m.stopCurrent(false)
		if err := m.start(); err != nil {
			m.log.Error("rejoin failed", "err", err)
		}
	}
}

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
	_ = prov.Shutdown(graceful)
	if graceful {
		cl.Shutdown(true)
	} else {
		sys.Shutdown()
		cl.Remote.Shutdown(false)
	}
}

// LiveDecode implements Members: live decode members by name, suspects excluded.
func (m *clusterMembers) LiveDecode() []requests.Candidate {
	all, _ := m.live()
	return all
}

// live returns placement candidates (decode, not suspect) and the names of
// every member still in the view (suspects included: they have not left).
func (m *clusterMembers) live() (cands []requests.Candidate, names []string) {
	m.mu.Lock()
	prov := m.prov
	m.mu.Unlock()
	if prov == nil {
		return nil, nil
	}
	for _, mem := range prov.Members() {
		if mem.Name == "" {
			continue
		}
		names = append(names, mem.Name)
		if mem.Role == cluster.RoleDecode && !mem.Suspect {
			cands = append(cands, requests.Candidate{ID: mem.Name, Load: mem.Load})
		}
	}
	return cands, names
}

// Present implements Members: every member name still in the view.
func (m *clusterMembers) Present() []string {
	_, names := m.live()
	return names
}

// OnChange implements Members.
func (m *clusterMembers) OnChange(fn func()) func() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.watchers = append(m.watchers, fn)
	if m.prov != nil {
		m.cancels = append(m.cancels, m.subscribe(m.prov, fn))
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
