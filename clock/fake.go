package clock

import (
	"fmt"
	"sync"
	"time"
)

// Fake is a manual Clock for tests. Its time stands still until Advance
// moves it; Advance fires the timers that fall due, in order of due time
// (timers due at the same instant in the order they were started or
// reset), setting Now to each timer's due time as it fires it, and all on
// the calling goroutine before it returns:
//
//   - an AfterFunc callback runs there (it may start, stop or reset timers,
//     and one it starts that falls due within the same Advance fires too;
//     it must not call Advance);
//   - a timer or ticker sends on its channel, which holds one value: a tick
//     nobody has received yet is dropped, as package time drops it.
//
// A timer started with d <= 0 is due at once: the next Advance (Advance(0)
// will do) fires it. Stop and Reset drain the channel, as package time's do
// since Go 1.23, so no stale value is received after them. Safe for
// concurrent use.
type Fake struct {
	adv    sync.Mutex // serialises Advance, so callbacks fire in order
	mu     sync.Mutex // guards what follows
	now    time.Time
	seq    uint64
	timers map[*fakeTimer]struct{} // pending timers
}

// NewFake returns a Fake whose time is start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, timers: map[*fakeTimer]struct{}{}}
}

type fakeTimer struct {
	f      *Fake
	due    time.Time
	seq    uint64        // orders timers due at the same instant
	period time.Duration // > 0 for a ticker
	fn     func()        // AfterFunc's callback, or nil
	ch     chan time.Time
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// AfterFunc calls fn when an Advance reaches now+d.
func (f *Fake) AfterFunc(d time.Duration, fn func()) Timer {
	t := &fakeTimer{f: f, fn: fn}
	t.Reset(d)
	return t
}

// NewTimer returns a timer that sends the fake time when an Advance
// reaches now+d.
func (f *Fake) NewTimer(d time.Duration) (Timer, <-chan time.Time) {
	t := &fakeTimer{f: f, ch: make(chan time.Time, 1)}
	t.Reset(d)
	return t, t.ch
}

// NewTicker returns a ticker that sends the fake time every d of fake time.
// It panics if d <= 0, as time.NewTicker does.
func (f *Fake) NewTicker(d time.Duration) (Ticker, <-chan time.Time) {
	if d <= 0 {
		panic(fmt.Sprintf("clock: non-positive ticker period %s", d))
	}
	t := &fakeTicker{fakeTimer{f: f, ch: make(chan time.Time, 1), period: d}}
	t.Reset(d)
	return t, t.ch
}

// Pending is the number of timers and tickers that have not fired (a
// ticker counts until it is stopped). Tests use it to see that a component
// armed, or stopped, its timers.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// NextDue is when the earliest pending timer falls due; ok is false when
// none is pending.
func (f *Fake) NextDue() (at time.Time, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t := f.earliest(); t != nil {
		return t.due, true
	}
	return time.Time{}, false
}

// Advance moves the fake time forward by d (d >= 0), firing every timer
// due by then in order, and returns when all of them have fired. It panics
// if d < 0.
func (f *Fake) Advance(d time.Duration) {
	if d < 0 {
		panic(fmt.Sprintf("clock: Advance(%s): time does not go back", d))
	}
	f.adv.Lock()
	defer f.adv.Unlock()
	f.mu.Lock()
	target := f.now.Add(d)
	f.mu.Unlock()
	for f.fireNext(target) {
	}
	f.mu.Lock()
	if f.now.Before(target) {
		f.now = target
	}
	f.mu.Unlock()
}

// fireNext fires the earliest timer due by target; false if there is none.
func (f *Fake) fireNext(target time.Time) bool {
	f.mu.Lock()
	t := f.earliest()
	if t == nil || t.due.After(target) {
		f.mu.Unlock()
		return false
	}
	if t.due.After(f.now) {
		f.now = t.due
	}
	now := f.now
	if t.period > 0 {
		f.seq++
		t.due, t.seq = t.due.Add(t.period), f.seq
	} else {
		delete(f.timers, t)
	}
	fn, ch := t.fn, t.ch
	f.mu.Unlock()
	if fn != nil {
		fn()
		return true
	}
	select {
	case ch <- now:
	default: // the last value is still unread: drop this one
	}
	return true
}

// earliest is the pending timer that falls due first. f.mu is held.
func (f *Fake) earliest() *fakeTimer {
	var first *fakeTimer
	for t := range f.timers {
		if first == nil || t.due.Before(first.due) || (t.due.Equal(first.due) && t.seq < first.seq) {
			first = t
		}
	}
	return first
}

// Stop implements Timer.
func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	_, pending := t.f.timers[t]
	delete(t.f.timers, t)
	t.drain()
	return pending
}

// Reset implements Timer.
func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	_, pending := t.f.timers[t]
	t.f.seq++
	t.due, t.seq = t.f.now.Add(d), t.f.seq
	t.f.timers[t] = struct{}{}
	t.drain()
	return pending
}

// drain empties the channel of a timer that is stopped or reset.
func (t *fakeTimer) drain() {
	if t.ch == nil {
		return
	}
	select {
	case <-t.ch:
	default:
	}
}

// fakeTicker is a fakeTimer with a period, behind the Ticker interface.
type fakeTicker struct{ fakeTimer }

// Stop implements Ticker.
func (t *fakeTicker) Stop() { t.fakeTimer.Stop() }

// Reset implements Ticker. It panics if d <= 0, as time.Ticker's does.
func (t *fakeTicker) Reset(d time.Duration) {
	if d <= 0 {
		panic(fmt.Sprintf("clock: non-positive ticker period %s", d))
	}
	t.f.mu.Lock()
	t.period = d
	t.f.mu.Unlock()
	t.fakeTimer.Reset(d)
}
