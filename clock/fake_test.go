package clock

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// TestFakeFiresInOrder: Advance fires due timers in order of due time
// (ties in start order), with Now at each one's due time, and leaves the
// rest pending.
func TestFakeFiresInOrder(t *testing.T) {
	f := NewFake(t0)
	var log []string
	at := func(name string) func() {
		return func() { log = append(log, fmt.Sprintf("%s@%s", name, f.Now().Sub(t0))) }
	}
	f.AfterFunc(3*time.Second, at("c"))
	f.AfterFunc(time.Second, at("a"))
	f.AfterFunc(time.Second, at("b"))
	late := f.AfterFunc(10*time.Second, at("late"))
	f.Advance(5 * time.Second)
	if got, want := strings.Join(log, " "), "a@1s b@1s c@3s"; got != want {
		t.Fatalf("fired %q, want %q", got, want)
	}
	if got := f.Now().Sub(t0); got != 5*time.Second {
		t.Fatalf("now %s after Advance(5s)", got)
	}
	if n := f.Pending(); n != 1 {
		t.Fatalf("%d pending, want 1", n)
	}
	if at, ok := f.NextDue(); !ok || at.Sub(t0) != 10*time.Second {
		t.Fatalf("next due %v %v", at, ok)
	}
	if !late.Stop() {
		t.Fatal("Stop of a pending timer reported false")
	}
	if late.Stop() {
		t.Fatal("second Stop reported true")
	}
	f.Advance(time.Hour)
	if len(log) != 3 {
		t.Fatalf("a stopped timer fired: %v", log)
	}
}

// TestFakeCallbackStartsTimer: a timer started by a callback that falls due
// within the same Advance fires in it; one due later waits.
func TestFakeCallbackStartsTimer(t *testing.T) {
	f := NewFake(t0)
	var log []string
	f.AfterFunc(time.Second, func() {
		log = append(log, "first")
		f.AfterFunc(time.Second, func() { log = append(log, "second@"+f.Now().Sub(t0).String()) })
		f.AfterFunc(time.Minute, func() { log = append(log, "third") })
	})
	f.Advance(2 * time.Second)
	if got, want := strings.Join(log, " "), "first second@2s"; got != want {
		t.Fatalf("fired %q, want %q", got, want)
	}
	if f.Pending() != 1 {
		t.Fatalf("%d pending", f.Pending())
	}
}

// TestFakeResetAndDueNow: Reset moves a timer from now; a timer started
// with d <= 0 fires at the next Advance, even Advance(0).
func TestFakeResetAndDueNow(t *testing.T) {
	f := NewFake(t0)
	n := 0
	tm := f.AfterFunc(time.Second, func() { n++ })
	f.Advance(500 * time.Millisecond)
	if !tm.Reset(time.Second) {
		t.Fatal("Reset of a pending timer reported false")
	}
	f.Advance(900 * time.Millisecond)
	if n != 0 {
		t.Fatal("fired at its old due time after Reset")
	}
	f.Advance(100 * time.Millisecond)
	if n != 1 {
		t.Fatalf("fired %d times", n)
	}
	if tm.Reset(0) {
		t.Fatal("Reset of a fired timer reported true")
	}
	if n != 1 {
		t.Fatal("a due-now timer fired outside Advance")
	}
	f.Advance(0)
	if n != 2 {
		t.Fatalf("fired %d times after Advance(0)", n)
	}
}

// TestFakeTimerChannel: a channel timer sends the fake time once; Stop
// drains an unread value.
func TestFakeTimerChannel(t *testing.T) {
	f := NewFake(t0)
	tm, c := f.NewTimer(time.Second)
	f.Advance(time.Second)
	select {
	case got := <-c:
		if !got.Equal(t0.Add(time.Second)) {
			t.Fatalf("sent %v", got)
		}
	default:
		t.Fatal("nothing sent")
	}
	tm.Reset(time.Second)
	f.Advance(time.Second)
	tm.Stop()
	select {
	case v := <-c:
		t.Fatalf("a stale value %v after Stop", v)
	default:
	}
}

// TestFakeTicker: a ticker sends every period; ticks nobody received are
// dropped (the channel holds one); Stop ends it.
func TestFakeTicker(t *testing.T) {
	f := NewFake(t0)
	tk, c := f.NewTicker(time.Second)
	f.Advance(3500 * time.Millisecond)
	got := <-c
	if !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("first unread tick carries %v, want the first one's time", got)
	}
	select {
	case v := <-c:
		t.Fatalf("a dropped tick was kept: %v", v)
	default:
	}
	f.Advance(500 * time.Millisecond)
	if got := <-c; !got.Equal(t0.Add(4 * time.Second)) {
		t.Fatalf("tick at %v, want 4s", got.Sub(t0))
	}
	tk.Reset(10 * time.Second)
	f.Advance(9 * time.Second)
	select {
	case v := <-c:
		t.Fatalf("tick %v before the new period", v.Sub(t0))
	default:
	}
	tk.Stop()
	f.Advance(time.Hour)
	select {
	case v := <-c:
		t.Fatalf("tick %v after Stop", v.Sub(t0))
	default:
	}
	if f.Pending() != 0 {
		t.Fatalf("%d pending after Stop", f.Pending())
	}
}

// TestFakeAdvanceBackwardsPanics: time does not go back.
func TestFakeAdvanceBackwardsPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Advance(-1s) did not panic")
		}
	}()
	NewFake(t0).Advance(-time.Second)
}

// TestRealAndOr: Or(nil) is the system clock, and Real's timers fire.
func TestRealAndOr(t *testing.T) {
	c := Or(nil)
	if _, ok := c.(Real); !ok {
		t.Fatalf("Or(nil) = %T", c)
	}
	done := make(chan struct{})
	c.AfterFunc(time.Millisecond, func() { close(done) })
	<-done
	f := NewFake(t0)
	if Or(f) != Clock(f) {
		t.Fatal("Or(f) != f")
	}
	s := Skewed{Skew: -time.Hour}
	if d := time.Since(s.Now()); d < 59*time.Minute {
		t.Fatalf("skewed clock is %s behind, want an hour", d)
	}
}
