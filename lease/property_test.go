package lease

import (
	"math/rand"
	"testing"
	"time"
)

// TestRandomHistories drives holds with random event sequences and checks
// the invariants: blocks are freed at most once, only after Deregister, and
// never while a pull that has not passed its deadline is running; a hold
// left alone is freed by its own wake-ups.
func TestRandomHistories(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	t0 := time.Unix(0, 0)
	for iter := 0; iter < 2000; iter++ {
		now := t0
		mode := Mode(rng.Intn(2))
		h, err := New(now, Config{Retain: time.Duration(1+rng.Intn(10)) * time.Second, Mode: mode, Owner: "p", Consumer: "d"})
		if err != nil {
			t.Fatal(err)
		}
		frees, deregs := 0, 0
		running := map[string]time.Time{}
		check := func(fx []Effect) {
			for _, e := range fx {
				switch e := e.(type) {
				case Deregister:
					deregs++
				case Free:
					frees++
					if deregs != frees {
						t.Fatalf("iter %d: free without a preceding deregister", iter)
					}
					if e.Reason != EngineGone {
						for id, dl := range running {
							if now.Before(dl) {
								t.Fatalf("iter %d: freed while pull %s runs until %v (now %v)", iter, id, dl, now)
							}
						}
					}
				case PullAbandoned:
					delete(running, e.PullID)
				}
			}
		}
		for step := 0; step < 30; step++ {
			var fx []Effect
			var err error
			who := []string{"d", "p", "x"}[rng.Intn(3)]
			switch rng.Intn(7) {
			case 0:
				now = now.Add(time.Duration(rng.Intn(4000)) * time.Millisecond)
				fx, err = h.Step(Tick{Now: now})
			case 1:
				fx, err = h.Step(Renew{Now: now, By: who})
			case 2, 3:
				id := string(rune('a' + rng.Intn(5)))
				dl := now.Add(time.Duration(1+rng.Intn(5)) * time.Second)
				fx, err = h.Step(PullStart{Now: now, By: who, PullID: id, Deadline: dl})
				if err == nil {
					running[id] = dl
				}
			case 4:
				id := string(rune('a' + rng.Intn(5)))
				fx, err = h.Step(PullEnd{Now: now, PullID: id, OK: rng.Intn(2) == 0})
				if err == nil {
					delete(running, id)
				}
			case 5:
				fx, err = h.Step(Release{Now: now, By: who})
			case 6:
				if rng.Intn(10) == 0 {
					fx, err = h.Step(EngineGoneEvent{Now: now})
					running = map[string]time.Time{}
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
		if frees != 1 || !h.Status().Freed {
			t.Fatalf("iter %d: freed %d times, state %s", iter, frees, h.Status().State)
		}
	}
}
