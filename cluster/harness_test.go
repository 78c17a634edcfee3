package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	actorcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/connex/connex/harness/poll"
)

// These helpers start real servers and protoactor systems. protoactor's own
// code trips the race detector, so tests that use them skip under -race;
// the pure logic (view, config, subjects, wire) is tested race-clean.

const testClusterName = "test"

// echoKind is a cluster kind whose grains answer a StringValue with it.
const echoKind = "echo"

// quiet discards protoactor's and our logs unless CLUSTER_TEST_LOG is set.
func quiet() *slog.Logger {
	if os.Getenv("CLUSTER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceEnabled {
		t.Skip("protoactor-go trips the race detector; run without -race")
	}
}

// runNATS starts an embedded nats-server on a free port.
func runNATS(t *testing.T) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(s.Shutdown)
	return s
}

// checkFor polls fn until it returns nil; poll.Until fails the test with
// fn's last error once total has passed.
func checkFor(t *testing.T, total, every time.Duration, fn func() error) {
	t.Helper()
	poll.Until(t, total, every, fn)
}

// testMember is one protoactor system with its cluster and provider.
type testMember struct {
	sys    *actor.ActorSystem
	cl     *actorcluster.Cluster
	p      *Provider
	nc     *nats.Conn
	client bool
	// stopped is set once the member was stopped (StopMember): stop then
	// only closes its NATS connection.
	stopped bool

	mu     sync.Mutex
	events []timedEvent
}

type timedEvent struct {
	Event
	at time.Time
}

func newTestMember(t *testing.T, url string, role Role, client bool) *testMember {
	t.Helper()
	m, err := tryTestMember(url, role, client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.stop)
	return m
}

// tryTestMember starts a member (or client) without touching t, so that it
// may run off the test goroutine.
func tryTestMember(url string, role Role, client bool) (*testMember, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	cfg := DefaultLocalConfig()
	cfg.Role = role
	cfg.Logger = quiet()
	p, err := NewProvider(nc, cfg)
	if err != nil {
		nc.Close()
		return nil, err
	}
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	echo := actorcluster.NewKind(echoKind, actor.PropsFromFunc(func(ctx actor.Context) {
		if s, ok := ctx.Message().(*wrapperspb.StringValue); ok {
			ctx.Respond(wrapperspb.String(s.GetValue() + "@" + ctx.ActorSystem().ID))
		}
	}))
	ccfg := ActorClusterConfig(testClusterName, p, disthash.New(), NewRemoteConfig("127.0.0.1", 0, RemoteOptions{}),
		actorcluster.WithKinds(echo))
	m := &testMember{sys: sys, cl: actorcluster.New(sys, ccfg), p: p, nc: nc, client: client}
	if client {
		m.cl.StartClient()
	} else if err := StartMember(m.cl, p); err != nil {
		nc.Close()
		return nil, err
	}
	m.p.Subscribe(func(e Event) {
		m.mu.Lock()
		m.events = append(m.events, timedEvent{e, time.Now()})
		m.mu.Unlock()
	})
	return m, nil
}

// startMembers starts one member per role, concurrently.
func startMembers(t *testing.T, url string, roles ...Role) []*testMember {
	t.Helper()
	ms := make([]*testMember, len(roles))
	errs := make([]error, len(roles))
	var wg sync.WaitGroup
	for i, r := range roles {
		wg.Go(func() { ms[i], errs[i] = tryTestMember(url, r, false) })
	}
	wg.Wait()
	for _, m := range ms {
		if m != nil {
			t.Cleanup(m.stop)
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return ms
}

// stop tears the member down without protoactor's 2 s graceful wait, and
// without Cluster.Shutdown on a client (it panics there).
func (m *testMember) stop() {
	if m.stopped {
		m.nc.Close()
		return
	}
	_ = m.p.Shutdown(false)
	if m.client {
		m.sys.Shutdown()
		m.cl.Remote.Shutdown(false)
	} else {
		m.cl.Shutdown(false)
		// What a graceful Cluster.Shutdown would also stop, minus its 2 s
		// sleep; without it every test leaks a running gossip actor.
		m.cl.Gossip.Shutdown()
		m.cl.IdentityLookup.Shutdown()
	}
	m.nc.Close()
}

func (m *testMember) id() string { return m.sys.ID }

// firstEvent is the first recorded event of type typ about id.
func (m *testMember) firstEvent(typ EventType, id string) (timedEvent, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.events {
		if e.Type == typ && e.Member.ID == id {
			return e, true
		}
	}
	return timedEvent{}, false
}

// lastEvent is the last recorded event of type typ about id.
func (m *testMember) lastEvent(typ EventType, id string) (timedEvent, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := len(m.events) - 1; i >= 0; i-- {
		if e := m.events[i]; e.Type == typ && e.Member.ID == id {
			return e, true
		}
	}
	return timedEvent{}, false
}

// waitLeft waits up to total until m sees exactly ids and has recorded
// gone's EventLeft (the snapshot is published before its events reach
// the subscribers, so the first alone can hold before the event is
// recorded), and returns that event.
func (m *testMember) waitLeft(t *testing.T, total time.Duration, gone string, ids ...string) timedEvent {
	t.Helper()
	var e timedEvent
	checkFor(t, total, 5*time.Millisecond, func() error {
		if err := m.sees(ids...); err != nil {
			return err
		}
		var ok bool
		if e, ok = m.firstEvent(EventLeft, gone); !ok {
			return fmt.Errorf("%s: no left event of %s recorded yet", m.id(), gone)
		}
		return nil
	})
	return e
}

// sees reports whether m's Membership and protoactor's MemberList both
// hold exactly ids.
func (m *testMember) sees(ids ...string) error {
	got := map[string]bool{}
	for _, mm := range m.p.Members() {
		got[mm.ID] = true
	}
	if len(got) != len(ids) {
		return fmt.Errorf("%s: Membership has %d members, want %d", m.id(), len(got), len(ids))
	}
	for _, id := range ids {
		if !got[id] {
			return fmt.Errorf("%s: Membership lacks %s", m.id(), id)
		}
		if !m.cl.MemberList.ContainsMemberID(id) {
			return fmt.Errorf("%s: protoactor MemberList lacks %s", m.id(), id)
		}
	}
	if n := m.cl.MemberList.Length(); n != len(ids) {
		return fmt.Errorf("%s: protoactor MemberList has %d members, want %d", m.id(), n, len(ids))
	}
	return nil
}
