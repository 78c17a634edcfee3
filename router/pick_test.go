package router

import (
	"testing"
	"time"

	"github.com/connex/connex/messages"
)

func eng(id, role, model string, inFlight, free uint32) Engine {
	return Engine{Member: "m-" + id, Info: &messages.EngineInfo{EngineId: id, Role: role, Model: model, InFlight: inFlight, BlocksFree: free, BaseUrl: "http://" + id}}
}

func TestPick(t *testing.T) {
	es := []Engine{
		eng("d2", "decode", "m", 1, 100),
		eng("d1", "decode", "m", 1, 100),
		eng("d3", "decode", "m", 0, 10),
		eng("d4", "decode", "other", 0, 1000),
		eng("p1", "prefill", "m", 0, 1000),
	}
	cases := []struct {
		name string
		busy map[string]int
		skip map[string]bool
		want string
		ok   bool
	}{
		{"least in flight wins over free blocks", nil, nil, "d3", true},
		{"the router's own legs count", map[string]int{"d3": 2}, nil, "d1", true},
		{"ties go to more free blocks, then the smaller id", nil, map[string]bool{"d3": true}, "d1", true},
		{"skipped engines are never picked", nil, map[string]bool{"d1": true, "d2": true, "d3": true}, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := Pick(es, "decode", "m", c.busy, c.skip)
			if ok != c.ok || got.Info.GetEngineId() != c.want {
				t.Fatalf("Pick = %q, %v; want %q, %v", got.Info.GetEngineId(), ok, c.want, c.ok)
			}
		})
	}
	all, servable := Models(es)
	if len(all) != 2 || !servable["m"] || servable["other"] {
		t.Fatalf("Models = %v %v", all, servable)
	}
}

// TestPickSuspects: an engine whose member is suspect (silent, probed, not
// gone) is passed over while an unsuspected one qualifies, however loaded,
// and chosen when it is the only one left: a CPU-starved box makes every
// member late at once, and refusing them answered no_engine while every
// engine lived (issue 30).
func TestPickSuspects(t *testing.T) {
	sus := eng("d9", "decode", "x", 0, 1)
	sus.Suspect = true
	busy := eng("d1", "decode", "x", 40, 0)
	if got, ok := Pick([]Engine{sus, busy}, "decode", "x", nil, nil); !ok || got.Info.GetEngineId() != "d1" {
		t.Fatalf("Pick = %q, %v; want the unsuspected d1 although the suspect is idle", got.Info.GetEngineId(), ok)
	}
	if got, ok := Pick([]Engine{sus, busy}, "decode", "x", nil, map[string]bool{"d1": true}); !ok || got.Info.GetEngineId() != "d9" {
		t.Fatalf("Pick = %q, %v; want the suspect d9 when it is the only engine left", got.Info.GetEngineId(), ok)
	}
	if _, ok := Pick([]Engine{sus}, "decode", "x", nil, map[string]bool{"d9": true}); ok {
		t.Fatal("a skipped suspect was picked")
	}
	if _, servable := Models([]Engine{sus, eng("p1", "prefill", "x", 0, 1)}); !servable["x"] {
		t.Fatal("a model whose decode engine is suspect is not servable")
	}
}

func TestStall(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := &Stall{Min: 300 * time.Millisecond, Factor: 8, FirstToken: 30 * time.Second}
	s.Start(t0)
	if d := s.Deadline(t0); !d.Equal(t0.Add(30 * time.Second)) {
		t.Fatalf("before the first token the deadline is FirstToken: %v", d.Sub(t0))
	}
	now := t0.Add(time.Second)
	s.Token(now)
	if w := s.Window(); w != 300*time.Millisecond {
		t.Fatalf("one token, no gap yet: window %v, want the minimum", w)
	}
	for i := 0; i < 5; i++ {
		now = now.Add(20 * time.Millisecond)
		s.Token(now)
	}
	if w := s.Window(); w != 300*time.Millisecond {
		t.Fatalf("20 ms gaps ×8 = 160 ms < min: window %v", w)
	}
	now = now.Add(120 * time.Millisecond)
	s.Token(now)
	if w := s.Window(); w != 300*time.Millisecond {
		t.Fatalf("one slow gap (120 ms) among 20 ms ones must not inflate the window: %v", w)
	}
	now = now.Add(200 * time.Millisecond)
	s.Token(now)
	if w := s.Window(); w != 400*time.Millisecond {
		t.Fatalf("twice the longest recent gap (200 ms): window %v, want 400ms", w)
	}
	if d := s.Deadline(t0); !d.Equal(now.Add(400 * time.Millisecond)) {
		t.Fatalf("deadline counts from the last token: %v", d.Sub(now))
	}
	slow := &Stall{Min: 300 * time.Millisecond, Factor: 8, FirstToken: time.Second}
	at := t0
	for i := 0; i < 5; i++ {
		at = at.Add(100 * time.Millisecond)
		slow.Token(at)
	}
	if w := slow.Window(); w != 800*time.Millisecond {
		t.Fatalf("a slow engine (100 ms gaps ×8): window %v, want 800ms", w)
	}
	// The slow gap leaves the window after gapWindow more tokens.
	for i := 0; i < gapWindow; i++ {
		now = now.Add(20 * time.Millisecond)
		s.Token(now)
	}
	if w := s.Window(); w != 300*time.Millisecond {
		t.Fatalf("old gaps must age out: window %v", w)
	}
	// A new leg waits for its first token again but remembers the gaps.
	s.Start(now)
	if d := s.Deadline(now); !d.Equal(now.Add(30 * time.Second)) {
		t.Fatalf("a new leg's first token: %v", d.Sub(now))
	}
}

// TestStallRouterLateness: a stall timer that fires late means the router
// itself was not running (a CPU-starved box): tokens may wait unread, so
// the leg is not failed then; the deadline moves back by the lateness and
// the leg is judged again. A truly silent engine is still found: by an
// on-time firing, and after at most one window of such moves.
func TestStallRouterLateness(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	s := &Stall{Min: 300 * ms, Factor: 8, FirstToken: time.Second}
	s.Start(t0)
	last := t0
	for range 20 { // an engine at 20 ms a token: the window is the 300 ms minimum
		last = last.Add(20 * ms)
		s.Token(last)
	}
	if s.Expired(t0, last.Add(299*ms)) {
		t.Fatal("expired before the deadline")
	}
	// On time (within lateTolerance): the engine was silent for the window.
	if !s.Expired(t0, last.Add(305*ms)) {
		t.Fatal("an on-time firing after a silent window did not expire")
	}
	// Fired 120 ms late: not expired, the deadline moves by 120 ms.
	if s.Expired(t0, last.Add(420*ms)) {
		t.Fatal("a late firing (the router starved) failed the leg")
	}
	if d := s.Deadline(t0); !d.Equal(last.Add(420 * ms)) {
		t.Fatalf("deadline after a 120 ms late firing: +%v, want +420ms", d.Sub(last))
	}
	// The token that waited arrives: the grace is gone with the gap.
	s.Token(last.Add(421 * ms))
	last = last.Add(421 * ms)
	if d := s.Deadline(t0); !d.Equal(last.Add(s.Window())) {
		t.Fatalf("a token must clear the grace: deadline +%v", d.Sub(last))
	}
	// A silent engine on a starved router: every firing late, the moves stop
	// after one window, then the leg fails.
	w := s.Window()
	now := last.Add(w)
	expired := false
	for i := 0; i < 10 && !expired; i++ {
		now = s.Deadline(t0).Add(200 * ms)
		expired = s.Expired(t0, now)
	}
	if !expired {
		t.Fatal("a silent engine was never found while every firing came late")
	}
	if now.Sub(last) > 2*w+200*ms {
		t.Fatalf("found after %v: want within two windows and the last lateness (%v)", now.Sub(last), 2*w+200*ms)
	}
	// Before the first token the same holds against FirstToken.
	s.Start(now)
	if s.Expired(now, now.Add(time.Second+100*ms)) {
		t.Fatal("a late firing before the first token failed the leg")
	}
	if !s.Expired(now, now.Add(time.Second+100*ms+5*ms)) {
		t.Fatal("an on-time firing after the moved first-token deadline did not expire")
	}
}

// TestStallAliveProbes: an engine silent past its deadline that answers a
// health probe gets one more window from the answer, at most
// maxAliveProbes times in one gap; a token starts the count afresh.
func TestStallAliveProbes(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := time.Millisecond
	s := &Stall{Min: 300 * ms, Factor: 8, FirstToken: time.Second}
	s.Start(t0)
	s.Token(t0)
	now := t0.Add(300 * ms)
	for i := range maxAliveProbes {
		if !s.Expired(t0, now) || !s.Probe() {
			t.Fatalf("probe %d: expired %v, probe %v; want a probe due", i, s.Expired(t0, now), s.Probe())
		}
		now = now.Add(50 * ms) // the answer comes late: the engine is starved
		s.Alive(now)
		if d := s.Deadline(t0); !d.Equal(now.Add(300 * ms)) {
			t.Fatalf("after an answered probe the deadline is one window on: +%v", d.Sub(now))
		}
		now = s.Deadline(t0)
	}
	if !s.Expired(t0, now) || s.Probe() {
		t.Fatal("an engine that answers probes but never sends a token again is held off forever")
	}
	s.Token(now)
	if !s.Probe() {
		t.Fatal("a token must start the probe count afresh")
	}
}
