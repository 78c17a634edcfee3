package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
)

// restartLog records the events of Options.OnRestart.
type restartLog struct {
	mu  sync.Mutex
	evs []RestartEvent
}

func (l *restartLog) add(ev RestartEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, ev)
}

// of is the events of target so far.
func (l *restartLog) of(target string) []RestartEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []RestartEvent
	for _, ev := range l.evs {
		if ev.Target == target {
			out = append(out, ev)
		}
	}
	return out
}

// waitPhase waits until target's last event is phase, and returns it.
func (l *restartLog) waitPhase(t *testing.T, target string, phase RestartPhase) RestartEvent {
	t.Helper()
	var last RestartEvent
	poll.Until(t, 20*time.Second, 5*time.Millisecond, func() error {
		evs := l.of(target)
		if len(evs) == 0 {
			return fmt.Errorf("no event for %s", target)
		}
		if last = evs[len(evs)-1]; last.Phase != phase {
			return fmt.Errorf("%s's last event: %s", target, last)
		}
		return nil
	})
	return last
}

func fakeRestarting(t *testing.T, p RestartPolicy) (Options, *restartLog) {
	o := fakeOptions(t)
	o.Restart = p
	log := &restartLog{}
	o.OnRestart = log.add
	return o, log
}

// TestLocalFakeRestartsWhatDied: with a restart policy, a killed engine,
// connexd or router comes back (only the part that died) with a new pid,
// and the event says so; a process stopped on purpose (Term) does not; and
// Close leaves no process behind.
func TestLocalFakeRestartsWhatDied(t *testing.T) {
	needProc(t)
	ctx := context.Background()
	o, log := fakeRestarting(t, RestartPolicy{After: 20 * time.Millisecond})
	c, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	for _, target := range []string{"decode-1/engine", "decode-0/connexd", "router"} {
		before := c.PIDs()
		if err := c.Kill(target); err != nil {
			t.Fatal(err)
		}
		ev := log.waitPhase(t, target, Restarted)
		after := c.PIDs()
		if ev.OldPID != before[target] || ev.NewPID != after[target] || ev.NewPID == ev.OldPID || ev.Exit != "signal: killed" {
			t.Errorf("%s: event %+v; pids before %d, now %d", target, ev, before[target], after[target])
		}
		if procState(ev.OldPID) != "gone" || !c.Running(target) {
			t.Errorf("%s: old pid %s, running %v", target, procState(ev.OldPID), c.Running(target))
		}
		for name, pid := range before { // only the part that died moved
			if name != target && after[name] != pid {
				t.Errorf("killing %s restarted %s too (%d → %d)", target, name, pid, after[name])
			}
		}
		if target == "decode-1/engine" {
			if url, _ := c.EngineURL("decode-1"); ev.URL != url || ev.Metrics != url+"/metrics" {
				t.Errorf("%s: event URL %q metrics %q, engine serves at %s", target, ev.URL, ev.Metrics, url)
			}
		}
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	// Asked-for exits stay: Term, then a kill whose restart the test
	// waits for, so prefill-0's watchers had their chance.
	if err := c.Term("prefill-0"); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill("decode-0/engine"); err != nil {
		t.Fatal(err)
	}
	log.waitPhase(t, "decode-0/engine", Restarted)
	if evs := slices.Concat(log.of("prefill-0/engine"), log.of("prefill-0/connexd")); len(evs) != 0 || c.Running("prefill-0/engine") {
		t.Errorf("a Term'd engine was restarted: %v", evs)
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if kids := children(t); len(kids) != 0 {
		t.Errorf("processes left after Close: %v", kids)
	}
}

// TestLocalFakeRestartBacksOff: a process that dies again while it starts
// is retried with a doubling delay up to the cap, and comes back once it
// can.
func TestLocalFakeRestartBacksOff(t *testing.T) {
	needProc(t)
	failFile := filepath.Join(t.TempDir(), "fail")
	t.Setenv("LOCALCLUSTER_FAKE_FAILFILE", failFile)
	o, log := fakeRestarting(t, RestartPolicy{After: 20 * time.Millisecond, Max: 80 * time.Millisecond})
	c, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := os.WriteFile(failFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Kill("decode-0/engine"); err != nil {
		t.Fatal(err)
	}
	var delays []time.Duration
	poll.Until(t, 20*time.Second, 5*time.Millisecond, func() error {
		delays = delays[:0]
		for _, ev := range log.of("decode-0/engine") {
			if ev.Phase == RestartScheduled {
				delays = append(delays, ev.Delay)
			}
		}
		if len(delays) < 5 {
			return fmt.Errorf("scheduled delays so far %v", delays)
		}
		return nil
	})
	ms := time.Millisecond
	if want := []time.Duration{20 * ms, 40 * ms, 80 * ms, 80 * ms, 80 * ms}; !slices.Equal(delays[:5], want) {
		t.Errorf("delays %v, want %v first", delays, want)
	}
	for _, ev := range log.of("decode-0/engine")[1:] {
		if ev.Phase == RestartFailed && ev.Err == nil {
			t.Errorf("a failed restart without its error: %+v", ev)
		}
	}
	if err := os.Remove(failFile); err != nil {
		t.Fatal(err)
	}
	log.waitPhase(t, "decode-0/engine", Restarted)
	if !c.Running("decode-0/engine") {
		t.Error("decode-0/engine not running after its restart")
	}
}

// TestLocalFakeCloseCancelsRestarts: Close while a restart waits out its
// delay, and while a restarted process is still starting, leaves no
// process behind.
func TestLocalFakeCloseCancelsRestarts(t *testing.T) {
	needProc(t)
	t.Run("pending", func(t *testing.T) {
		o, log := fakeRestarting(t, RestartPolicy{After: time.Hour})
		c, err := Start(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Kill("decode-1/engine"); err != nil {
			t.Fatal(err)
		}
		log.waitPhase(t, "decode-1/engine", RestartScheduled)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if kids := children(t); len(kids) != 0 {
			t.Errorf("processes left after Close: %v", kids)
		}
	})
	t.Run("starting", func(t *testing.T) {
		hold := filepath.Join(t.TempDir(), "hold")
		t.Setenv("LOCALCLUSTER_FAKE_HOLDFILE", hold)
		o, log := fakeRestarting(t, RestartPolicy{After: time.Millisecond})
		c, err := Start(context.Background(), o)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(hold, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		old, _ := c.PID("decode-1/connexd")
		if err := c.Kill("decode-1/connexd"); err != nil {
			t.Fatal(err)
		}
		// The new connexd runs and waits before its ready line.
		poll.Until(t, 20*time.Second, 5*time.Millisecond, func() error {
			if pid, _ := c.PID("decode-1/connexd"); pid == old || !c.Running("decode-1/connexd") {
				return errors.New("no new decode-1/connexd yet")
			}
			return nil
		})
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if kids := children(t); len(kids) != 0 {
			t.Errorf("processes left after Close: %v", kids)
		}
		for _, ev := range log.of("decode-1/connexd") {
			if ev.Phase != RestartScheduled {
				t.Errorf("a restart cancelled by Close reported %s", ev)
			}
		}
	})
}

// TestLocalClusterRestartsAKilledEngine: with a restart policy, the only
// decode engine's connex-sim killed with SIGKILL (as a user does, from
// outside) comes back by itself, and the next completion through the
// router is served by it: it is the only decode engine, and its own
// counters, which start at zero, count the request. Then the same for its
// connexd and for the router.
func TestLocalClusterRestartsAKilledEngine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	o := realOptions(ctx, t)
	o.Decode = 1
	o.Restart = RestartPolicy{After: 100 * time.Millisecond}
	log := &restartLog{}
	o.OnRestart = log.add
	c, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	complete(t, c.RouterURL())

	for _, target := range []string{"decode-0/engine", "decode-0/connexd", "router"} {
		old, _ := c.PID(target)
		if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		ev := log.waitPhase(t, target, Restarted)
		if ev.OldPID != old || ev.Exit != "signal: killed" || ev.NewPID == old || ev.Metrics == "" && target == "decode-0/engine" {
			t.Fatalf("restart event %+v (killed pid %d)", ev, old)
		}
		if err := c.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.WaitEngines(ctx); err != nil {
			t.Fatal(err)
		}
		if _, decode := completion(t, c.RouterURL()); decode != "decode-0" {
			t.Errorf("after %s's restart: served by decode engine %q, want decode-0", target, decode)
		}
		if target == "decode-0/engine" {
			m := scrape(t, ev.Metrics, "")
			if loads, ok := m.value("connex_sim_kv_loads_total", "outcome", "ok"); !ok || loads != 1 {
				t.Errorf("the restarted engine's connex_sim_kv_loads_total{outcome=ok} = %v (%v), want 1", loads, ok)
			}
		}
	}
}
