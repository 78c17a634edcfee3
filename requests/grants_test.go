package requests

import (
	"fmt"
	"testing"
	"time"
)

func TestGrants(t *testing.T) {
	var g Grants
	now := time.Unix(1000, 0)
	if g.Take("r1", "e2", now) {
		t.Fatal("a takeover without a grant was allowed")
	}
	g.Grant("r1", "e2", GrantTTL, now)
	if g.Take("r1", "evil", now) {
		t.Fatal("a grant to e2 let another engine take the request over")
	}
	if !g.Take("r1", "e2", now.Add(GrantTTL-time.Millisecond)) {
		t.Fatal("the granted engine could not take the request over")
	}
	if g.Take("r1", "e2", now) {
		t.Fatal("a grant was used twice")
	}
	g.Grant("r2", "e2", GrantTTL, now)
	if g.Take("r2", "e2", now.Add(GrantTTL)) {
		t.Fatal("an expired grant was used")
	}
	for i := 0; i < MaxGrants+10; i++ {
		g.Grant(fmt.Sprintf("r%d", i), "e", GrantTTL, now.Add(time.Duration(i)*time.Microsecond))
	}
	if len(g.live) > MaxGrants {
		t.Fatalf("%d grants kept, at most %d", len(g.live), MaxGrants)
	}
	if !g.Take(fmt.Sprintf("r%d", MaxGrants+9), "e", now) {
		t.Fatal("the newest grant was dropped")
	}
}

// A router that waits longer than GrantTTL for a resumed leg's first token
// asks for a grant that long: an engine whose takeover waited in its queue
// past 30 s still takes the request over.
func TestGrantLifetime(t *testing.T) {
	for _, c := range []struct {
		ms   uint32
		want time.Duration
	}{{0, GrantTTL}, {1500, 1500 * time.Millisecond}, {120_000, 2 * time.Minute}, {^uint32(0), MaxGrantTTL}} {
		if got := GrantLifetime(c.ms); got != c.want {
			t.Errorf("GrantLifetime(%d) = %v, want %v", c.ms, got, c.want)
		}
	}
	var g Grants
	now := time.Unix(1000, 0)
	g.Grant("r1", "e2", GrantLifetime(120_000), now)
	if !g.Take("r1", "e2", now.Add(90*time.Second)) {
		t.Fatal("a 2-minute grant had lapsed after 90 s")
	}
}
