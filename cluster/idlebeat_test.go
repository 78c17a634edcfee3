package cluster

import (
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	actorcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// Idle heartbeats (Config.IdleHeartbeatInterval): the view scripts run
// DefaultLocalConfig (50 ms beats, suspect after 100 ms, TTL 1 s, cap
// 500 ms); its idle interval is 400 ms (gaps up to 440 ms).

// TestViewIdleMemberIsNotSuspectedBetweenItsBeats: a member that announces
// its idle interval is not suspected in its 440 ms gaps, though a busy one
// would be after 100 ms; once it falls silent it is suspected at two of
// its idle intervals capped at half the TTL (500 ms), and a probe finding
// it gone removes it.
func TestViewIdleMemberIsNotSuspectedBetweenItsBeats(t *testing.T) {
	runViewScript(t, `
		hb b every=50ms
		=> joined b; announce
		advance 50ms
		# b turns idle: its next beat comes up to 440 ms later
		hb b every=400ms
		advance 440ms
		tick
		hb b every=400ms
		advance 440ms
		tick
		hb b every=400ms
		members
		=> a b
		deadline
		=> +1.43s
		advance 499ms
		tick
		advance 1ms
		tick
		=> suspect b; probe b
		probe-unreachable b
		=> left b (unreachable); report b (unreachable)
	`)
}

// TestViewMemberTurningBusyIsSuspectedAtTheFullRate: the gaps a member
// kept while idle do not stretch its suspicion once it announces the full
// rate again: silent 100 ms after its first busy beat, it is suspected.
func TestViewMemberTurningBusyIsSuspectedAtTheFullRate(t *testing.T) {
	runViewScript(t, `
		hb b every=400ms
		=> joined b; announce
		advance 440ms
		hb b every=400ms
		advance 430ms
		hb b every=400ms
		advance 200ms
		hb b every=50ms
		advance 99ms
		tick
		advance 1ms
		tick
		=> suspect b; probe b
	`)
}

// TestViewIdleIntervalCannotOutlastTheTTL: a member announcing an interval
// longer than the TTL (a bug, or a member of another preset) is still
// suspected at half the TTL and removed at the TTL.
func TestViewIdleIntervalCannotOutlastTheTTL(t *testing.T) {
	runViewScript(t, `
		hb b every=1h
		=> joined b; announce
		deadline
		=> +500ms
		advance 500ms
		tick
		=> suspect b; probe b
		probe-timeout b
		advance 500ms
		tick
		=> left b (timeout); report b (timeout)
	`)
}

// TestViewOwnIdleBeatsAreNoBusStall: beating at the idle interval, our own
// echo comes every 400–440 ms; that is no stalled bus (no lag accrues, so
// the others' silence still counts). Told nothing of our idle interval,
// the view would take each gap for a stall. Turning busy again does not
// make the idle echo overdue.
func TestViewOwnIdleBeatsAreNoBusStall(t *testing.T) {
	idle := `
		hb b every=400ms
		=> joined b; announce
		hb a
	` + strings.Repeat(`
		advance 220ms
		tick
		advance 220ms
		hb a
		hb b every=400ms
		tick
	`, 3)
	runViewScript(t, `
		beat-every 400ms
	`+idle+`
		lag
		=> 0s
		# busy again: the next echo is due a busy grace from now, not from
		# the last idle echo 440 ms ago
		advance 100ms
		beat-every 50ms
		tick
		advance 1ms
		hb a
		tick
		lag
		=> 0s
	`)
	runViewScript(t, idle+`
		lag
		=> 280ms
	`)
}

// TestViewBusyMemberKeepsItsSuspicion: a member announcing the full rate
// is suspected after SuspectAfter as before (the announcement stretches
// only longer intervals).
func TestViewBusyMemberKeepsItsSuspicion(t *testing.T) {
	runViewScript(t, `
		hb b every=50ms
		=> joined b; announce
		deadline
		=> +100ms
	`)
}

func TestBeatInterval(t *testing.T) {
	ms := time.Millisecond
	t0 := time.Unix(1_700_000_000, 0)
	for _, c := range []struct {
		name            string
		idle, idleAfter time.Duration
		since           time.Duration
		want            time.Duration
	}{
		{"busy just now", 400 * ms, time.Second, 0, 50 * ms},
		{"busy within idleAfter", 400 * ms, time.Second, 999 * ms, 50 * ms},
		{"idle at idleAfter", 400 * ms, time.Second, time.Second, 400 * ms},
		{"no idle interval", 0, time.Second, time.Hour, 50 * ms},
	} {
		if got := beatInterval(50*ms, c.idle, c.idleAfter, t0, t0.Add(c.since)); got != c.want {
			t.Errorf("%s: beatInterval = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestActivityTouch: Touch records the time and wakes an idle provider
// once, and only an idle one.
func TestActivityTouch(t *testing.T) {
	a := NewActivity(nil)
	if !a.lastTouch().IsZero() {
		t.Fatal("a fresh Activity has been touched")
	}
	before := time.Now()
	a.Touch()
	if got := a.lastTouch(); got.Before(before.Add(-time.Millisecond)) || got.After(time.Now().Add(time.Millisecond)) {
		t.Fatalf("lastTouch %v, want about %v", got, before)
	}
	select {
	case <-a.wake:
		t.Fatal("Touch woke a provider that beats at the full rate")
	default:
	}
	a.idle.Store(true)
	a.Touch()
	a.Touch()
	select {
	case <-a.wake:
	default:
		t.Fatal("Touch did not wake an idle provider")
	}
	select {
	case <-a.wake:
		t.Fatal("two Touches queued two wakes")
	default:
	}
}

// TestSetLoadWakesAnIdleProvider: a load raised with no Touch (a request
// adopted after a failover) is work in hand at once: an idle provider is
// woken to announce the full rate, not at its next idle beat.
func TestSetLoadWakesAnIdleProvider(t *testing.T) {
	act := NewActivity(nil)
	cfg := DefaultLocalConfig()
	cfg.Role, cfg.Logger, cfg.Activity = RoleDecode, quiet(), act
	nc, err := nats.Connect(runNATS(t).ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	p, err := NewProvider(nc, cfg) // not started: no loop takes the wake
	if err != nil {
		t.Fatal(err)
	}
	act.idle.Store(true)
	p.SetLoad(0)
	select {
	case <-act.wake:
		t.Fatal("SetLoad(0) woke an idle provider")
	default:
	}
	p.SetLoad(1)
	select {
	case <-act.wake:
	default:
		t.Fatal("SetLoad(1) did not wake an idle provider")
	}
	if act.lastTouch().IsZero() {
		t.Fatal("SetLoad(1) left no Touch for the next beat to read")
	}
}

func TestConfigIdleHeartbeat(t *testing.T) {
	for _, c := range []Config{DefaultLocalConfig(), DefaultLANConfig(), DefaultWANConfig()} {
		if err := c.Validate(); err != nil {
			t.Errorf("preset %+v: %v", c, err)
		}
	}
	for name, c := range map[string]struct {
		idle time.Duration
		want string
	}{
		"negative":        {-time.Millisecond, "must not be negative"},
		"shorter":         {40 * time.Millisecond, "shorter than the heartbeat interval"},
		"past half a TTL": {455 * time.Millisecond, "no room under half the TTL"},
	} {
		cfg := DefaultLocalConfig()
		cfg.IdleHeartbeatInterval = c.idle
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate() = %v, want an error saying %q", name, err, c.want)
		}
	}
}

// TestProviderBeatsIdleAndWakesOnWork: over a real NATS server, a member
// with nothing in hand announces its idle interval once a TTL has passed
// and beats at it; Activity.Touch brings the full rate back at once, and
// a load above zero keeps it there.
func TestProviderBeatsIdleAndWakesOnWork(t *testing.T) {
	skipUnderRace(t)
	s := runNATS(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var working atomic.Bool
	act := NewActivity(working.Load)
	cfg := DefaultLocalConfig()
	cfg.Role, cfg.Logger, cfg.Activity = RoleDecode, quiet(), act
	p, err := NewProvider(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watch.Close)
	beats := make(chan time.Duration, 1024)
	if _, err := watch.Subscribe(DefaultSubjectPrefix+"."+testClusterName+".events.heartbeat.*", func(m *nats.Msg) {
		var a messages.MemberAnnounce
		if proto.Unmarshal(m.Data, &a) == nil {
			beats <- time.Duration(a.GetHeartbeatIntervalMs()) * time.Millisecond
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	cl := actorcluster.New(sys, ActorClusterConfig(testClusterName, p, disthash.New(), NewRemoteConfig("127.0.0.1", 0, RemoteOptions{})))
	cl.StartMember()
	t.Cleanup(func() { _ = p.Shutdown(false); cl.Remote.Shutdown(false) })

	// until waits for an announce of interval want, counting those before.
	until := func(want time.Duration, what string) int {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for n := 0; ; n++ {
			select {
			case iv := <-beats:
				if iv == want {
					return n
				}
			case <-deadline:
				t.Fatalf("%s: no heartbeat announcing %v within 10s", what, want)
			}
		}
	}
	// count drains the announces of d, failing on any not of want.
	count := func(d, want time.Duration, what string) int {
		t.Helper()
		n, end := 0, time.After(d)
		for {
			select {
			case iv := <-beats:
				if iv != want {
					t.Fatalf("%s: a heartbeat announced %v, want %v", what, iv, want)
				}
				n++
			case <-end:
				return n
			}
		}
	}
	until(cfg.HeartbeatInterval, "at start")
	until(cfg.IdleHeartbeatInterval, "after a TTL without work")
	// 1.2 s idle: three beats at 400 ms (24 at the full rate).
	if n := count(1200*time.Millisecond, cfg.IdleHeartbeatInterval, "idle"); n > 6 {
		t.Fatalf("%d heartbeats in 1.2 s at the idle interval of %v", n, cfg.IdleHeartbeatInterval)
	}
	act.Touch()
	until(cfg.HeartbeatInterval, "after Touch")
	p.SetLoad(1)
	// A TTL and more with a request in hand: the full rate throughout.
	if n := count(1500*time.Millisecond, cfg.HeartbeatInterval, "loaded"); n < 6 {
		t.Fatalf("%d heartbeats in 1.5 s while loaded, want the full rate (%v)", n, cfg.HeartbeatInterval)
	}
	p.SetLoad(0)
	until(cfg.IdleHeartbeatInterval, "a TTL after the load ended")
	// Work in hand that Activity's inHand reports (live holds, pulls)
	// keeps it at the full rate too, without a Touch.
	working.Store(true)
	until(cfg.HeartbeatInterval, "with work in hand")
	if n := count(1500*time.Millisecond, cfg.HeartbeatInterval, "with work in hand"); n < 6 {
		t.Fatalf("%d heartbeats in 1.5 s with work in hand, want the full rate (%v)", n, cfg.HeartbeatInterval)
	}
}

// TestViewStarvedIdleObserverStillFindsAHungPeer: an idle member ticks
// only every ~400 ms; CPU-starved, it wakes 141 ms late each time, so 501
// ms pass between its ticks, past pausedAfter (500 ms at local). That
// lateness is its lag, not a pause of its own: a peer that hung meanwhile
// is still suspected once its silence net of our lag reaches 500 ms (two of
// its 400 ms beats, capped at TTL/2) and removed at the TTL (1 s). It was
// forgiven on every tick, forever, when any gap between ticks past
// pausedAfter counted as a pause.
func TestViewStarvedIdleObserverStillFindsAHungPeer(t *testing.T) {
	runViewScript(t, `
		beat-every 400ms
		hb b every=400ms
		=> joined b; announce
		hb a
		tick
		advance 360ms
		late 141ms
		hb a
		tick
		advance 360ms
		late 141ms
		hb a
		tick
		=> suspect b; probe b
		probe-timeout b
		advance 360ms
		late 141ms
		hb a
		tick
		=> left b (timeout); report b (timeout)
	`)
}

// TestEngineChurnDoesNotFloodHeartbeats: an engine re-registering in a
// loop changes its member's engines at every call; the member announces
// out of turn at most every quarter interval, not at every change, so it
// cannot flood every member's heartbeat subscription.
func TestEngineChurnDoesNotFloodHeartbeats(t *testing.T) {
	skipUnderRace(t)
	s := runNATS(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := DefaultLocalConfig()
	cfg.Role, cfg.Logger = RoleDecode, quiet()
	p, err := NewProvider(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(watch.Close)
	var beats atomic.Int64
	if _, err := watch.Subscribe(DefaultSubjectPrefix+"."+testClusterName+".events.heartbeat.*", func(*nats.Msg) { beats.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	cl := actorcluster.New(sys, ActorClusterConfig(testClusterName, p, disthash.New(), NewRemoteConfig("127.0.0.1", 0, RemoteOptions{})))
	cl.StartMember()
	t.Cleanup(func() { _ = p.Shutdown(false); cl.Remote.Shutdown(false) })
	checkFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if beats.Load() == 0 {
			return errors.New("no heartbeat yet")
		}
		return nil
	})

	beats.Store(0)
	start := time.Now()
	changes := 0
	for time.Since(start) < 500*time.Millisecond {
		p.SetEngines([]*messages.EngineInfo{{EngineId: "e1", InFlight: uint32(changes)}})
		changes++ // an engine's calls, back to back
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	got := beats.Load()
	// Every regular beat, plus one out of turn per quarter interval, and
	// one beat of slack at each end.
	bound := int64(elapsed/cfg.HeartbeatInterval) + int64(elapsed/(cfg.HeartbeatInterval/4)) + 2
	t.Logf("%d engine changes in %v: %d heartbeats (at most %d)", changes, elapsed, got, bound)
	if got > bound {
		t.Fatalf("%d heartbeats for %d engine changes in %v, want at most %d", got, changes, elapsed, bound)
	}
}
