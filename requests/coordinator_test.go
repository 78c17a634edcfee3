package requests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeMembers is a Membership the test sets; fire plays a membership
// change.
type fakeMembers struct {
	mu        sync.Mutex
	live      []Candidate
	view      View
	departed  map[string]time.Time
	onChange  func()
	cancelled bool
}

func (f *fakeMembers) LiveDecode() []Candidate {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Candidate(nil), f.live...)
}

func (f *fakeMembers) View() View {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.view
}

func (f *fakeMembers) DepartedAt(name string) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.departed[name]
}

func (f *fakeMembers) OnChange(fn func()) func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onChange = fn
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.cancelled = true
	}
}

func (f *fakeMembers) fire() {
	f.mu.Lock()
	fn := f.onChange
	f.mu.Unlock()
	fn()
}

// TestCoordinatorLoop: the loop adopts its previous run's requests (and
// retries when the store fails), places orphans when membership changes
// and only while it coordinates, takes "fenced" as done, and stops.
func TestCoordinatorLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		departed := t0.Add(-time.Second)
		members := &fakeMembers{
			live:     []Candidate{{"m1", 9}, {"m2", 5}},
			view:     View{Present: map[string]bool{"m1": true, "m2": true}, Departed: map[string]bool{"d1": true}, Settled: map[string]bool{"m1": true, "m2": true}, Grace: time.Second},
			departed: map[string]time.Time{"d1": departed},
		}
		var (
			mu         sync.Mutex
			ownerScans int
			adopted    []Adoption
			here       []string
		)
		logs := &bytes.Buffer{}
		c := &Coordinator{
			Self:    "m1",
			Members: members,
			Owners: func(context.Context) (map[string]string, error) {
				mu.Lock()
				defer mu.Unlock()
				ownerScans++
				if ownerScans == 1 {
					return nil, errors.New("store down")
				}
				return map[string]string{"r0": "m1", "r1": "d1", "r2": "d1", "r9": "m2"}, nil
			},
			Adopt: func(_ context.Context, a Adoption) error {
				mu.Lock()
				defer mu.Unlock()
				adopted = append(adopted, a)
				if a.Request == "r1" {
					return fmt.Errorf("%w: adopted by m3 already", ErrFenced)
				}
				return nil
			},
			AdoptHere: func(_ context.Context, req, owner string) error {
				mu.Lock()
				defer mu.Unlock()
				here = append(here, req+"@"+owner)
				return nil
			},
			Running:  func(req string) bool { return req == "r9" },
			Interval: time.Second,
			Log:      slog.New(slog.NewTextHandler(logs, nil)),
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.Run(stop)
		}()
		synctest.Wait()
		mu.Lock()
		if ownerScans != 1 || len(here) != 0 || !strings.Contains(logs.String(), "previous run failed") {
			t.Fatalf("the first leftover scan: %d scans, adopted here %v, log %q", ownerScans, here, logs.String())
		}
		mu.Unlock()

		// A membership change: this member coordinates, so the departed
		// owner's requests go to the least-loaded member (fenced counts as
		// done), then the leftovers are retried and adopted here.
		members.fire()
		synctest.Wait()
		mu.Lock()
		want := []Adoption{
			{Request: "r1", DeadOwner: "d1", Target: "m2", DepartedAt: departed},
			{Request: "r2", DeadOwner: "d1", Target: "m2", DepartedAt: departed},
		}
		if !reflect.DeepEqual(adopted, want) {
			t.Fatalf("adoptions %+v, want %+v", adopted, want)
		}
		if !reflect.DeepEqual(here, []string{"r0@m1"}) {
			t.Fatalf("adopted here %v, want [r0@m1]", here)
		}
		if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
			t.Fatalf("%d warnings, want only the first scan's: %s", n, logs.String())
		}
		scans := ownerScans
		mu.Unlock()

		// m1 is no longer settled: the periodic rescan does not coordinate
		// (not even a scan of the store), and leftovers are done.
		members.mu.Lock()
		members.view.Settled = map[string]bool{"m2": true}
		members.mu.Unlock()
		// Inside the synctest bubble a sleep is the fake clock moving one
		// orphan_scan interval, at once; synctest.Wait then waits for the
		// tick's work to be done.
		time.Sleep(c.Interval)
		synctest.Wait()
		mu.Lock()
		if ownerScans != scans || len(adopted) != 2 {
			t.Fatalf("a member that does not coordinate scanned the store (%d scans, was %d) or adopted (%+v)", ownerScans, scans, adopted)
		}
		mu.Unlock()

		// It coordinates again: the next tick places the orphans again.
		members.mu.Lock()
		members.view.Settled = map[string]bool{"m1": true}
		members.mu.Unlock()
		time.Sleep(c.Interval)
		synctest.Wait()
		mu.Lock()
		if len(adopted) != 4 {
			t.Fatalf("the periodic rescan placed %d adoptions in all, want 4", len(adopted))
		}
		mu.Unlock()

		close(stop)
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("Run did not return after stop")
		}
		if !members.cancelled {
			t.Fatal("Run left its membership subscription")
		}
	})
}
