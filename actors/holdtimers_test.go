package actors

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/connex/connex/clock"
)

// TestLiveHoldsShareOneTimer pins what a live hold costs in timers and
// goroutines (make bench-holds measures the bytes): holds wait for their
// lease on one clock timer between them and on no goroutine of their own,
// a hold's wake-up goes when it ends (released or expired), and expiry
// still frees every hold through the shared timer.
func TestLiveHoldsShareOneTimer(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	rig := newHoldRigClock(t, clk)
	g0 := runtime.NumGoroutine()
	const n = 50
	for i := 0; i < n; i++ {
		if _, err := rig.create([]uint32{0, 1}); err != nil {
			t.Fatal(err)
		}
	}
	if got := rig.deps.timers().len(); got != n {
		t.Fatalf("%d wake-ups scheduled for %d live holds", got, n)
	}
	if got := clk.Pending(); got != 1 {
		t.Fatalf("%d clock timers pending for %d live holds, want 1", got, n)
	}
	poll(t, "no goroutine per live hold", func() error {
		if g := runtime.NumGoroutine(); g > g0 {
			return fmt.Errorf("%d goroutines more than before %d live holds", g-g0, n)
		}
		return nil
	})

	// A released hold's wake-up goes with it, before the answer.
	rep, err := rig.create([]uint32{2})
	if err != nil {
		t.Fatal(err)
	}
	e, _, _ := rig.dir.Lookup(rep.Create.Params.TransferId)
	if res, err := rig.sys.Root.RequestFuture(e.PID, &ReleaseHold{By: "e"}, time.Second).Result(); err != nil || res.(Reply).Err != nil {
		t.Fatalf("release: %v %v", err, res)
	}
	if got := rig.deps.timers().len(); got != n {
		t.Fatalf("%d wake-ups scheduled after a release, want %d", got, n)
	}

	// Expiry through the shared timer frees them all, and leaves nothing
	// scheduled; their actors stop after lingering.
	clk.Advance(time.Minute + time.Second)
	poll(t, "every hold expired", func() error {
		if f := rig.metrics.HoldsFreed.Load(); f != n+1 {
			return fmt.Errorf("%d of %d holds freed", f, n+1)
		}
		return nil
	})
	if got := rig.deps.timers().len(); got != 0 {
		t.Fatalf("%d wake-ups left after every hold ended", got)
	}
	clk.Advance(lingerAfterFree + time.Second)
	poll(t, "actors stopped", func() error {
		if r := rig.regRefs.Load(); r != 0 {
			return fmt.Errorf("%d holds still reference the region", r)
		}
		if p := clk.Pending(); p != 0 {
			return fmt.Errorf("%d clock timers pending", p)
		}
		return nil
	})
}
