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
	g.Grant("r1", "e2", now)
	if g.Take("r1", "evil", now) {
		t.Fatal("a grant to e2 let another engine take the request over")
	}
	if !g.Take("r1", "e2", now.Add(GrantTTL-time.Millisecond)) {
		t.Fatal("the granted engine could not take the request over")
	}
	if g.Take("r1", "e2", now) {
		t.Fatal("a grant was used twice")
	}
	g.Grant("r2", "e2", now)
	if g.Take("r2", "e2", now.Add(GrantTTL)) {
		t.Fatal("an expired grant was used")
	}
	for i := 0; i < MaxGrants+10; i++ {
		g.Grant(fmt.Sprintf("r%d", i), "e", now.Add(time.Duration(i)*time.Microsecond))
	}
	if len(g.live) > MaxGrants {
		t.Fatalf("%d grants kept, at most %d", len(g.live), MaxGrants)
	}
	if !g.Take(fmt.Sprintf("r%d", MaxGrants+9), "e", now) {
		t.Fatal("the newest grant was dropped")
	}
}
