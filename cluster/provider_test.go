package cluster

import (
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	actorcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// detectGuard bounds the wait for a failure detection whose design goal is
// goal. The tests check that detection happens and for which reason, not
// how fast: a loaded 2-core machine stretches timers, and the figures are
// logged here and measured by make bench-cluster (BenchmarkFailover).
func detectGuard(goal time.Duration) time.Duration { return 5*goal + 5*time.Second }

func TestProviderJoinLoadAndGracefulLeave(t *testing.T) {
	skipUnderRace(t)
	s := runNATS(t)
	ms := startMembers(t, s.ClientURL(), RolePrefill, RoleDecode, RoleDecode)
	a, b, c := ms[0], ms[1], ms[2]
	all := []string{a.id(), b.id(), c.id()}
	for _, m := range ms {
		checkFor(t, 10*time.Second, 10*time.Millisecond, func() error { return m.sees(all...) })
	}

	// Roles and kinds travel; load updates reach the others.
	decode := a.p.MembersByRole(RoleDecode)
	if ids := memberIDs(decode); !slices.Equal(ids, sorted(b.id(), c.id())) {
		t.Fatalf("a sees decode members %v, want %v", ids, sorted(b.id(), c.id()))
	}
	if !slices.Contains(decode[0].Kinds, echoKind) {
		t.Fatalf("kinds %v lack %q", decode[0].Kinds, echoKind)
	}
	b.p.SetLoad(7)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if m, ok := a.p.Member(b.id()); !ok || m.Load != 7 {
			return fmt.Errorf("a sees b as %+v, want load 7", m)
		}
		return nil
	})

	// protoactor's topology is usable: a grain call is placed and answered.
	res, err := a.cl.Request("hello", echoKind, wrapperspb.String("hi"))
	if err != nil {
		t.Fatalf("grain request: %v", err)
	}
	if got := res.(*wrapperspb.StringValue).GetValue(); !strings.HasPrefix(got, "hi@") {
		t.Fatalf("grain answered %q", got)
	}

	// A client follows without being a member.
	cl := newTestMember(t, s.ClientURL(), RoleRouter, true)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error { return cl.sees(all...) })
	if got := len(a.p.Members()); got != 3 {
		t.Fatalf("the client was counted as a member: %d members", got)
	}

	// Subscribe replays the live set first.
	var replay []string
	cancel := a.p.Subscribe(func(e Event) {
		if e.Type == EventJoined {
			replay = append(replay, e.Member.ID)
		}
	})
	cancel()
	if !slices.Equal(sorted(replay...), sorted(all...)) {
		t.Fatalf("replay %v, want %v", replay, all)
	}

	// A graceful leave (what connexd's shutdown does) is seen at once,
	// well before any timer, and stops c's protoactor parts.
	left := time.Now()
	StopMember(c.cl, c.p)
	c.stopped = true
	if !c.sys.IsStopped() {
		t.Fatal("StopMember left c's actor system running")
	}
	if _, err := net.DialTimeout("tcp", c.sys.Address(), time.Second); err == nil {
		t.Fatalf("c's protoactor remote at %s still accepts connections after StopMember", c.sys.Address())
	}
	for _, m := range []*testMember{a, b, cl} {
		e := m.waitLeft(t, detectGuard(a.p.cfg.SuspectAfter()), c.id(), a.id(), b.id())
		if e.Reason != ReasonLeave {
			t.Fatalf("%s saw c leave with reason %q, want %q", m.id(), e.Reason, ReasonLeave)
		}
		t.Logf("graceful leave seen by %s after %v", m.id(), e.at.Sub(left))
	}
	if !a.cl.Remote.BlockList().IsBlocked(c.id()) {
		t.Fatal("protoactor did not block the departed id")
	}

	// A probe that overtakes the leave notice (protoactor lost c's gRPC
	// stream while c stopped) learns of the leave too, while c's NATS
	// connection lives: it is told "left", not "no responders".
	msg, err := a.nc.Request(a.p.subj.ping(c.id()), nil, 2*time.Second)
	if err != nil {
		t.Fatalf("probe of the departed member: %v, want its \"left\" answer", err)
	}
	if in, ok := probeOutcome(c.id(), msg, nil).(inGone); !ok || in.reporter != c.id() {
		t.Fatalf("probe of the departed member reads as %#v, want its own leave", probeOutcome(c.id(), msg, nil))
	}
}

func TestProbeOutcome(t *testing.T) {
	m := Member{ID: "m1", Host: "127.0.0.1", Port: 7000, Role: RoleDecode}
	b, err := proto.Marshal(announceOf(m, 0, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	left := &nats.Msg{Header: nats.Header{probeStateHeader: []string{probeStateLeft}}}
	for _, tc := range []struct {
		name string
		msg  *nats.Msg
		err  error
		want any
	}{
		{"alive", &nats.Msg{Data: b}, nil, "heartbeat"},
		{"left", left, nil, inGone{id: "m1", reporter: "m1"}},
		{"no responders", nil, nats.ErrNoResponders, inProbeFailed{id: "m1", unreachable: true}},
		{"timeout", nil, nats.ErrTimeout, inProbeFailed{id: "m1"}},
		{"another member's announce", &nats.Msg{Data: b}, nil, "heartbeat"},
		{"garbage", &nats.Msg{Data: []byte{0xff, 0x01}}, nil, inProbeFailed{id: "m1"}},
		{"an unknown state", &nats.Msg{Header: nats.Header{probeStateHeader: []string{"resting"}}}, nil, inProbeFailed{id: "m1"}},
	} {
		id := "m1"
		if tc.name == "another member's announce" {
			id, tc.want = "m2", inProbeFailed{id: "m2"}
		}
		got := probeOutcome(id, tc.msg, tc.err)
		if tc.want == "heartbeat" {
			if h, ok := got.(inHeartbeat); !ok || !h.probed || h.m.ID != id {
				t.Errorf("%s: got %#v, want a probed heartbeat of %s", tc.name, got, id)
			}
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: got %#v, want %#v", tc.name, got, tc.want)
		}
	}
}

// threeDecodeMembers starts three decode members on a fresh NATS server
// and waits until each sees all three.
func threeDecodeMembers(t *testing.T) (a, b, c *testMember) {
	t.Helper()
	s := runNATS(t)
	ms := startMembers(t, s.ClientURL(), RoleDecode, RoleDecode, RoleDecode)
	a, b, c = ms[0], ms[1], ms[2]
	for _, m := range ms {
		checkFor(t, 10*time.Second, 10*time.Millisecond, func() error { return m.sees(a.id(), b.id(), c.id()) })
	}
	return a, b, c
}

func TestProviderCrashedMemberIsRemovedFast(t *testing.T) {
	skipUnderRace(t)
	a, b, c := threeDecodeMembers(t)
	// Let gossip open gRPC streams between all members, as in a running cluster.
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error { return gossipConnected(a, b, c) })

	// What SIGKILL does to c: its NATS connection and its gRPC server vanish.
	killed := time.Now()
	c.nc.Close()
	c.cl.Remote.Shutdown(false)

	seeUnreachableLeave(t, "kill", killed, detectGuard(a.p.cfg.SuspectAfter()+a.p.cfg.ProbeTimeout), c, a, b)
}

func TestProviderMemberWithoutNATSIsRemovedByProbe(t *testing.T) {
	skipUnderRace(t)
	a, b, c := threeDecodeMembers(t)

	// c loses NATS but its protoactor remote stays up, so no gRPC hint:
	// only silence and the "no responders" probe find it.
	silenced := time.Now()
	c.nc.Close()

	seeUnreachableLeave(t, "lost NATS link", silenced, detectGuard(maxHeartbeatGap(a.p.cfg.HeartbeatInterval, a.p.cfg.HeartbeatJitter)+a.p.cfg.SuspectAfter()), c, a, b)
}

// seeUnreachableLeave waits (up to guard) until each of the others sees
// only itself and its peers, checks that gone left as unreachable (or
// reported so by a peer), and logs how long after the fault, what, each
// took.
func seeUnreachableLeave(t *testing.T, what string, fault time.Time, guard time.Duration, gone *testMember, others ...*testMember) {
	t.Helper()
	ids := make([]string, len(others))
	for i, m := range others {
		ids[i] = m.id()
	}
	for _, m := range others {
		e := m.waitLeft(t, guard, gone.id(), ids...)
		if e.Reason != ReasonUnreachable && e.Reason != ReasonReported {
			t.Fatalf("%s saw %s leave with reason %q", m.id(), gone.id(), e.Reason)
		}
		t.Logf("%s detected by %s after %v (%s)", what, m.id(), e.at.Sub(fault), e.Reason)
	}
}

func TestProviderHungMemberIsRemovedAtTTLAndEvicted(t *testing.T) {
	skipUnderRace(t)
	a, b, c := threeDecodeMembers(t)

	// What SIGSTOP does to c, as the others see it: silence, probes time
	// out, but its NATS subscriptions stay.
	hung := time.Now()
	c.p.frozen.Store(true)

	ttl := a.p.cfg.TTL()
	for _, m := range []*testMember{a, b} {
		e := m.waitLeft(t, detectGuard(ttl), c.id(), a.id(), b.id())
		sus, _ := m.lastEvent(EventSuspect, c.id())
		if e.Reason != ReasonTimeout && e.Reason != ReasonReported {
			t.Fatalf("%s saw c leave with reason %q", m.id(), e.Reason)
		}
		// A probe timeout must not remove it; only the TTL, counted from
		// its last heartbeat (at most a suspicion period before the hang
		// on a loaded machine).
		if d := e.at.Sub(hung); d < ttl-a.p.cfg.SuspectAfter() {
			t.Fatalf("%s removed a hung member after %v, before its TTL %v", m.id(), d, ttl)
		}
		t.Logf("hang suspected by %s after %v, removed after %v (%s)", m.id(), sus.at.Sub(hung), e.at.Sub(hung), e.Reason)
	}

	// The zombie comes back: it is told it is dead and stays out.
	c.p.frozen.Store(false)
	checkFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if _, ok := c.firstEvent(EventSelfEvicted, c.id()); !ok {
			return fmt.Errorf("c was not told of its eviction")
		}
		return nil
	})
	for _, m := range []*testMember{a, b} {
		if err := m.sees(a.id(), b.id()); err != nil {
			t.Fatalf("zombie readmitted: %v", err)
		}
	}
}

// gossipConnected reports whether protoactor has exchanged gossip among
// all of ms, which means their gRPC streams are open.
func gossipConnected(ms ...*testMember) error {
	for _, m := range ms {
		hb, err := m.cl.Gossip.GetState(actorcluster.HeartbeatKey)
		if err != nil {
			return err
		}
		for _, o := range ms {
			if _, ok := hb[o.id()]; !ok {
				return fmt.Errorf("%s has no gossip from %s", m.id(), o.id())
			}
		}
	}
	return nil
}

func memberIDs(ms []Member) []string {
	ids := make([]string, 0, len(ms))
	for _, m := range ms {
		ids = append(ids, m.ID)
	}
	return ids
}

func sorted(ids ...string) []string {
	s := slices.Clone(ids)
	slices.Sort(s)
	return s
}

// TestGenerationFollowsWhatMembersShows: Generation moves whenever what
// Members answers changes (another member's engines, this member's load or
// engines), so that a cache keyed on it (the router's engine list) is never
// stale.
func TestGenerationFollowsWhatMembersShows(t *testing.T) {
	skipUnderRace(t)
	s := runNATS(t)
	ms := startMembers(t, s.ClientURL(), RoleRouter, RoleDecode)
	a, b := ms[0], ms[1]
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error { return a.sees(a.id(), b.id()) })

	g := a.p.Generation()
	a.p.SetLoad(3)
	if a.p.Generation() == g {
		t.Fatal("SetLoad left Generation as it was")
	}
	g = a.p.Generation()
	a.p.SetEngines([]*messages.EngineInfo{{EngineId: "own", Role: "decode", Model: "m"}})
	if a.p.Generation() == g {
		t.Fatal("SetEngines left Generation as it was")
	}

	// Another member's new engine reaches a's view with a new generation.
	g = a.p.Generation()
	b.p.SetEngines([]*messages.EngineInfo{{EngineId: "e1", Role: "decode", Model: "m"}})
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		m, ok := a.p.Member(b.id())
		if !ok || len(m.Engines) != 1 {
			return fmt.Errorf("a sees b as %+v, want its engine", m)
		}
		if a.p.Generation() == g {
			return fmt.Errorf("a's view shows b's engine but Generation is still %d", g)
		}
		return nil
	})
}
