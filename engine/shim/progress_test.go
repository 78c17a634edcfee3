package shim

import (
	"fmt"
	"testing"
	"time"
)

// TestProgressBatch: tokens go out in one call once `every` wait or the
// oldest is `delay` old, one call at a time; a failed call puts its tokens
// back in front, so a checkpoint never skips or reorders tokens.
func TestProgressBatch(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := newProgressBatch(3, 50*time.Millisecond, 0)
	if b.due(t0) || !b.wake().IsZero() || !b.idle() {
		t.Fatal("an empty batch is due, wakes or is busy")
	}
	b.add(t0, 1, 2)
	if b.due(t0.Add(49*time.Millisecond)) || b.wake() != t0.Add(50*time.Millisecond) {
		t.Fatalf("two of three tokens, 49 ms old: due, or wake %v", b.wake())
	}
	if !b.due(t0.Add(50 * time.Millisecond)) {
		t.Fatal("the oldest token 50 ms old: not due")
	}
	b.add(t0.Add(10*time.Millisecond), 3)
	if !b.due(t0.Add(10 * time.Millisecond)) {
		t.Fatal("three tokens waiting: not due")
	}
	sent := b.take(t0.Add(10 * time.Millisecond))
	b.add(t0.Add(20*time.Millisecond), 4, 5, 6)
	if b.due(t0.Add(time.Second)) || !b.wake().IsZero() || b.idle() {
		t.Fatal("a call in flight: another is due, or the batch wakes or is idle")
	}
	b.done(t0.Add(30*time.Millisecond), sent, true) // failed: its tokens go back in front
	if got := fmt.Sprint(b.take(t0.Add(30 * time.Millisecond))); got != "[1 2 3 4 5 6]" {
		t.Fatalf("after a failed call the next one sends %s, want [1 2 3 4 5 6]", got)
	}
	b.done(t0.Add(40*time.Millisecond), nil, false)
	if !b.idle() {
		t.Fatal("a call ended and nothing waits: not idle")
	}
	if b := newProgressBatch(0, time.Second, 0); !func() bool { b.add(t0, 7); return b.due(t0) }() {
		t.Fatal("every 0 is taken as 1: one token is due at once")
	}
}

// TestProgressBatchInterval: a call never goes out sooner than `interval`
// after the previous one, however many tokens wait: a fast engine's
// checkpoints come at a bounded rate. The batch wakes at the interval's
// end when enough tokens wait, and at the later of the interval's end and
// the oldest token's delay when too few do. The first call is not held
// back.
func TestProgressBatchInterval(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	b := newProgressBatch(2, 100*time.Millisecond, 250*time.Millisecond)
	b.add(t0, 1, 2)
	if !b.due(t0) {
		t.Fatal("the first call, two of two tokens waiting: not due")
	}
	b.done(ms(5), b.take(t0), false)
	b.add(ms(10), 3, 4, 5)
	if b.due(ms(249)) {
		t.Fatal("three tokens waiting 249 ms after the last call: due before the interval ended")
	}
	if w := b.wake(); !w.Equal(ms(250)) {
		t.Fatalf("enough tokens wait: wake=%v, want the interval's end (+250ms)", w.Sub(t0))
	}
	if !b.due(ms(250)) {
		t.Fatal("three tokens waiting at the interval's end: not due")
	}
	if got := fmt.Sprint(b.take(ms(250))); got != "[3 4 5]" {
		t.Fatalf("sent %s, want [3 4 5]", got)
	}
	b.done(ms(260), nil, false)
	b.add(ms(600), 6) // one of two: the delay (100 ms) decides, past the interval's end (500 ms)
	if w := b.wake(); !w.Equal(ms(700)) {
		t.Fatalf("one token waiting: wake=%v, want its delay's end (+700ms)", w.Sub(t0))
	}
	if b.due(ms(699)) || !b.due(ms(700)) {
		t.Fatal("one token, its delay ends at +700ms: due before it or not at it")
	}
	b.done(ms(710), b.take(ms(700)), false)
	b.add(ms(720), 7) // one token again: now the interval (to +950) ends after its delay (+820)
	if w := b.wake(); !w.Equal(ms(950)) {
		t.Fatalf("one token, interval longer than its delay: wake=%v, want +950ms", w.Sub(t0))
	}
	if b.due(ms(949)) || !b.due(ms(950)) {
		t.Fatal("one token, the interval ends at +950ms: due before it or not at it")
	}
}

// TestProgressBatchDiscard: a batch whose request's reports stopped drops
// what waits and neither wakes nor is due.
func TestProgressBatchDiscard(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := newProgressBatch(2, 10*time.Millisecond, 0)
	b.add(t0, 1, 2, 3)
	b.discard()
	if b.due(t0.Add(time.Hour)) || !b.wake().IsZero() || !b.idle() {
		t.Fatal("a discarded batch is due, wakes or is busy")
	}
}
