package lease

import (
	"errors"
	"math/rand"
	"testing"
	"time"
)

// TestRandomHistories drives holds with random event sequences and checks
// the invariants: blocks are freed exactly once, under every ending, only
// after Deregister, and never while a pull that has not passed its deadline
// is running (unless the hold ended under it: engine gone, shutdown,
// abort); every BeginRead is ended by exactly one EndRead, no later than
// the Free; a PullEnd by another reader than the starter is ErrNotYours and
// changes nothing; a hold left alone is freed by its own wake-ups.
func TestRandomHistories(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	t0 := time.Unix(0, 0)
	endings := map[State]int{}
	for iter := 0; iter < 2000; iter++ {
		now := t0
		mode := Mode(rng.Intn(2))
		var claim time.Duration
		if rng.Intn(3) == 0 { // a third of the holds wait for a claim
			claim = time.Duration(1+rng.Intn(3)) * time.Second
		}
		h, err := New(now, Config{Retain: time.Duration(1+rng.Intn(10)) * time.Second, Mode: mode, Owner: "p", Consumer: "d", Claim: claim})
		if err != nil {
			t.Fatal(err)
		}
		frees, deregs := 0, 0
		running := map[string]time.Time{} // pull id -> deadline
		starter := map[string]string{}    // pull id -> its reader
		reading := map[string]bool{}      // pull ids between BeginRead and EndRead
		check := func(fx []Effect) {
			for _, e := range fx {
				switch e := e.(type) {
				case BeginRead:
					if reading[e.PullID] {
						t.Fatalf("iter %d: BeginRead %s twice", iter, e.PullID)
					}
					if frees > 0 {
						t.Fatalf("iter %d: BeginRead %s after the free", iter, e.PullID)
					}
					reading[e.PullID] = true
				case EndRead:
					if !reading[e.PullID] {
						t.Fatalf("iter %d: EndRead %s without a BeginRead", iter, e.PullID)
					}
					delete(reading, e.PullID)
				case Deregister:
					deregs++
				case Free:
					frees++
					endings[e.Reason]++
					if deregs != frees {
						t.Fatalf("iter %d: free without a preceding deregister", iter)
					}
					if frees > 1 {
						t.Fatalf("iter %d: freed twice (%s)", iter, e.Reason)
					}
					if len(reading) > 0 {
						t.Fatalf("iter %d: freed (%s) with reads still marked: %v", iter, e.Reason, reading)
					}
					if e.Notify != (e.Reason != EngineGone) {
						t.Fatalf("iter %d: free %s with notify=%v", iter, e.Reason, e.Notify)
					}
					switch e.Reason {
					case EngineGone, ShutDown, Aborted:
						running = map[string]time.Time{}
					}
					for id, dl := range running {
						if now.Before(dl) {
							t.Fatalf("iter %d: freed while pull %s runs until %v (now %v)", iter, id, dl, now)
						}
					}
				case PullAbandoned:
					if reading[e.PullID] {
						t.Fatalf("iter %d: pull %s abandoned before its EndRead", iter, e.PullID)
					}
					delete(running, e.PullID)
				}
			}
		}
		for step := 0; step < 30; step++ {
			var fx []Effect
			var err error
			who := []string{"d", "p", "x"}[rng.Intn(3)]
			switch rng.Intn(8) {
			case 0:
				now = now.Add(time.Duration(rng.Intn(4000)) * time.Millisecond)
				fx, err = h.Step(Tick{Now: now})
			case 1:
				fx, err = h.Step(Renew{Now: now, By: who})
			case 2, 3:
				id := string(rune('a' + rng.Intn(5)))
				dl := now.Add(time.Duration(1+rng.Intn(5)) * time.Second)
				_, again := running[id]
				fx, err = h.Step(PullStart{Now: now, By: who, PullID: id, Deadline: dl})
				if err == nil && !again {
					running[id], starter[id] = dl, who
				}
			case 4:
				id := string(rune('a' + rng.Intn(5)))
				by := starter[id]
				wrong := rng.Intn(4) == 0
				if wrong {
					by = "y"
				}
				before := h.Status()
				fx, err = h.Step(PullEnd{Now: now, By: by, PullID: id, OK: rng.Intn(2) == 0})
				switch {
				case wrong && err == nil:
					t.Fatalf("iter %d: PullEnd of %s by another reader accepted", iter, id)
				case wrong && errors.Is(err, ErrNotYours):
					if st := h.Status(); st.ActivePulls != before.ActivePulls || st.PullsDone != before.PullsDone {
						t.Fatalf("iter %d: a refused PullEnd changed the hold: %+v -> %+v", iter, before, st)
					}
				case err == nil:
					delete(running, id)
				}
			case 5:
				fx, err = h.Step(Release{Now: now, By: who})
			case 6:
				switch rng.Intn(30) {
				case 0:
					fx, err = h.Step(EngineGoneEvent{Now: now})
				case 1:
					fx, err = h.Step(Shutdown{Now: now})
				case 2:
					fx, err = h.Step(Abort{Now: now})
				}
			case 7:
				if rng.Intn(40) == 0 {
					fx, err = h.Step(Abort{Now: now}) // a no-op unless live
				}
			}
			_ = err
			check(fx)
		}
		// Left alone, the hold's own wake-ups must free it.
		for i := 0; i < 100; i++ {
			at, ok := h.NextWake()
			if !ok {
				break
			}
			if at.After(now) {
				now = at
			}
			fx, _ := h.Step(Tick{Now: now})
			check(fx)
		}
		// An owner that stops afterwards changes nothing.
		fx, err := h.Step(Abort{Now: now})
		if err != nil {
			t.Fatalf("iter %d: Abort of an ended hold: %v", iter, err)
		}
		check(fx)
		if frees != 1 || !h.Status().Freed || !h.Status().State.Terminal() {
			t.Fatalf("iter %d: freed %d times, state %s", iter, frees, h.Status().State)
		}
		if len(reading) != 0 {
			t.Fatalf("iter %d: reads left marked: %v", iter, reading)
		}
	}
	for _, st := range []State{Released, Expired, Pulled, EngineGone, ShutDown, Aborted, Unclaimed} {
		if endings[st] == 0 {
			t.Errorf("no random history ended %s: widen the generator", st)
		}
	}
	t.Logf("endings: %v", endings)
}
