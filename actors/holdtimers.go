package actors

import (
	"container/heap"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/clock"
)

// holdTimers wakes hold actors at their lease's next wake-up with one
// clock timer for all of them (armed for the earliest), not one timer per
// hold: a timer and its callback cost each of 100k live holds ~150 bytes
// (make bench-holds), a wake entry 40, which the hold actor embeds.
// Safe for concurrent use: hold actors schedule from their own goroutines,
// the timer fires on the clock's.
type holdTimers struct {
	clock clock.Clock
	mu    sync.Mutex
	due   wakeHeap
	timer clock.Timer // armed for armed, the earliest due wake; nil when none
	armed time.Time
	sys   *actor.ActorSystem // the hold actors' (one per connexd)
}

// wake is one hold's place in holdTimers; the zero value is unscheduled.
// at and pos belong to holdTimers.mu (the timer goroutine pops wakes,
// other holds' schedules move them in the heap); pid is set once, by bind,
// before the first schedule, and read freely after.
type wake struct {
	at  time.Time
	pid *actor.PID // the hold actor to tick
	pos int        // index in the heap + 1; 0: not queued
}

// timers returns the hold actors' shared timers, made on first use.
func (d *HoldDeps) timers() *holdTimers {
	d.timersOnce.Do(func() { d.holdTimers = &holdTimers{clock: d.clock()} })
	return d.holdTimers
}

// bind names the actor w wakes, and its system (the same for every hold
// of a connexd); before w's first schedule.
func (t *holdTimers) bind(w *wake, pid *actor.PID, sys *actor.ActorSystem) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w.pid, t.sys = pid, sys
}

// system is the hold actors' system, nil before the first bind.
func (t *holdTimers) system() *actor.ActorSystem {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sys
}

// schedule has w's actor sent a tick at at (replacing w's earlier time).
func (t *holdTimers) schedule(w *wake, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w.pos != 0 && w.at.Equal(at) {
		return
	}
	w.at = at
	if w.pos == 0 {
		heap.Push(&t.due, w)
	} else {
		heap.Fix(&t.due, w.pos-1)
	}
	t.rearm()
}

// cancel unschedules w (idempotent).
func (t *holdTimers) cancel(w *wake) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w.pos == 0 {
		return
	}
	heap.Remove(&t.due, w.pos-1)
	t.rearm()
}

// len is the number of scheduled wakes.
func (t *holdTimers) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.due)
}

// rearm points the clock timer at the earliest wake, or stops it when
// none is left. t.mu is held.
func (t *holdTimers) rearm() {
	if len(t.due) == 0 {
		if t.timer != nil {
			t.timer.Stop()
			t.timer = nil
		}
		return
	}
	at := t.due[0].at
	if t.timer != nil && at.Equal(t.armed) {
		return
	}
	if t.timer != nil {
		t.timer.Stop()
	}
	t.armed = at
	t.timer = t.clock.AfterFunc(at.Sub(t.clock.Now()), t.fire)
}

// fire sends a tick to every hold whose wake is due and re-arms for the
// next. A hold reschedules itself when it handles the tick.
func (t *holdTimers) fire() {
	t.mu.Lock()
	now := t.clock.Now()
	var ready []*wake
	for len(t.due) > 0 && !t.due[0].at.After(now) {
		ready = append(ready, heap.Pop(&t.due).(*wake))
	}
	pids := make([]*actor.PID, 0, len(ready))
	for _, w := range ready {
		pids = append(pids, w.pid)
	}
	sys := t.sys
	t.timer = nil
	t.rearm()
	t.mu.Unlock()
	for _, pid := range pids {
		sys.Root.Send(pid, tick{})
	}
}

// wakeHeap orders wakes by time (container/heap).
type wakeHeap []*wake

func (h wakeHeap) Len() int           { return len(h) }
func (h wakeHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h wakeHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].pos, h[j].pos = i+1, j+1
}
func (h *wakeHeap) Push(x any) {
	w := x.(*wake)
	w.pos = len(*h) + 1
	*h = append(*h, w)
}
func (h *wakeHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.pos = 0
	return w
}
