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
	sus := eng("d9", "decode", "x", 0, 1)
	sus.Suspect = true
	if _, ok := Pick([]Engine{sus}, "decode", "x", nil, nil); ok {
		t.Fatal("an engine of a suspect member was picked")
	}
	all, servable := Models(es)
	if len(all) != 2 || !servable["m"] || servable["other"] {
		t.Fatalf("Models = %v %v", all, servable)
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
