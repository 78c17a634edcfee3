package actors

import (
	"fmt"
	"testing"
	"time"

	"github.com/connex/connex/clock"
	"github.com/connex/connex/lease"
)

// Tombstones are bounded: past the cap the oldest ended transfer is
// forgotten (a late caller then hears "unknown transfer"), and Sweep still
// forgets them by age.
func TestHoldTableTombstonesAreBounded(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	d := NewHoldTable(time.Minute, clk)
	d.maxEnded = 3
	for i := range 5 {
		d.end(fmt.Sprintf("t%d", i), lease.Released)
		clk.Advance(time.Second)
	}
	for i := range 5 {
		_, st, ended := d.Lookup(fmt.Sprintf("t%d", i))
		if want := i >= 2; ended != want || (ended && st != lease.Released) {
			t.Errorf("t%d: ended=%v state=%v, want ended=%v", i, ended, st, want)
		}
	}
	if len(d.ended) != 3 || len(d.order) != 3 {
		t.Fatalf("%d tombstones, %d ids in order; want 3 and 3", len(d.ended), len(d.order))
	}
	clk.Advance(time.Minute)
	d.Sweep()
	if len(d.ended) != 0 || len(d.order) != 0 {
		t.Fatalf("after the ttl: %d tombstones, %d ids in order; want none", len(d.ended), len(d.order))
	}
}
