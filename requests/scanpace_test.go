package requests

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestScanPaceNext: the coordinator rescans every Busy while something may
// be pending and every Idle once a pass found nothing.
func TestScanPaceNext(t *testing.T) {
	p := ScanPace{Busy: time.Second, Idle: 30 * time.Second}
	for _, c := range []struct {
		name string
		r    PassReport
		want time.Duration
	}{
		{"nothing pending", PassReport{}, 30 * time.Second},
		{"a membership change", PassReport{Kicked: true}, time.Second},
		{"a failed pass", PassReport{Failed: true}, time.Second},
		{"adoptions asked", PassReport{Asked: 2}, time.Second},
		{"still settling", PassReport{Unsettled: true}, time.Second},
	} {
		if got := p.Next(c.r); got != c.want {
			t.Errorf("%s: next pass in %v, want %v", c.name, got, c.want)
		}
	}
	for _, idle := range []time.Duration{0, time.Second / 2, time.Second} {
		if got := (ScanPace{Busy: time.Second, Idle: idle}).Next(PassReport{}); got != time.Second {
			t.Errorf("Idle %v (not above Busy): next pass in %v, want Busy", idle, got)
		}
	}
}

// TestCoordinatorScansIdleWhenNothingPending: a settled coordinator whose
// pass found nothing reads the store again only after IdleInterval; a
// membership change makes it scan at once, the adoptions it asks for keep
// it at Interval until a pass finds nothing again.
func TestCoordinatorScansIdleWhenNothingPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		members := &fakeMembers{
			live: []Candidate{{"m1", 0}, {"m2", 0}},
			view: View{Present: map[string]bool{"m1": true, "m2": true}, Departed: map[string]bool{},
				Settled: map[string]bool{"m1": true, "m2": true}, Watched: time.Hour, Grace: time.Second},
			departed: map[string]time.Time{},
		}
		var mu sync.Mutex
		scans := 0
		owners := map[string]string{"r1": "m2"}
		c := &Coordinator{
			Self:    "m1",
			Members: members,
			Owners: func(context.Context) (map[string]string, error) {
				mu.Lock()
				defer mu.Unlock()
				scans++
				out := map[string]string{}
				for k, v := range owners {
					out[k] = v
				}
				return out, nil
			},
			Adopt: func(_ context.Context, a Adoption) error {
				mu.Lock()
				defer mu.Unlock()
				owners[a.Request] = a.Target // what an adoption does to the store
				return nil
			},
			AdoptHere:    func(context.Context, string, string) error { return nil },
			Running:      func(string) bool { return false },
			Interval:     time.Second,
			IdleInterval: 30 * time.Second,
			Log:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		}
		scansNow := func() int {
			synctest.Wait()
			mu.Lock()
			defer mu.Unlock()
			return scans
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.Run(stop)
		}()
		if n := scansNow(); n != 1 {
			t.Fatalf("%d scans at start, want 1 (its leftovers)", n)
		}
		// Inside the synctest bubble each sleep below is the fake clock
		// moving by exactly that much, at once: the scan timing is what is
		// under test, and scansNow's synctest.Wait is the condition (every
		// goroutine of the bubble idle again) before each count is read.
		time.Sleep(time.Second) // the first rescan comes at Interval
		if n := scansNow(); n != 2 {
			t.Fatalf("%d scans after one Interval, want 2", n)
		}
		time.Sleep(28 * time.Second) // nothing was pending: no rescan before IdleInterval
		if n := scansNow(); n != 2 {
			t.Fatalf("%d scans 29 s in, want still 2: a quiet coordinator rescanned before orphan_idle_scan_ms", n)
		}
		time.Sleep(2 * time.Second)
		if n := scansNow(); n != 3 {
			t.Fatalf("%d scans after IdleInterval, want 3", n)
		}

		// m2 leaves: scanned at once, its request adopted; the pass after
		// (one Interval later) confirms, and finds nothing more.
		members.mu.Lock()
		members.live = []Candidate{{"m1", 0}}
		members.view.Present = map[string]bool{"m1": true}
		members.view.Departed = map[string]bool{"m2": true}
		members.mu.Unlock()
		members.fire()
		if n := scansNow(); n != 4 {
			t.Fatalf("%d scans after a membership change, want 4 (at once)", n)
		}
		mu.Lock()
		if owners["r1"] != "m1" {
			t.Fatalf("r1 not adopted: owner %q", owners["r1"])
		}
		mu.Unlock()
		time.Sleep(time.Second)
		if n := scansNow(); n != 5 {
			t.Fatalf("%d scans one Interval after the adoptions, want 5", n)
		}
		time.Sleep(time.Second)
		if n := scansNow(); n != 5 {
			t.Fatalf("%d scans, want still 5: the pass after the adoptions found nothing, so the next waits IdleInterval", n)
		}
		close(stop)
		<-done
	})
}
