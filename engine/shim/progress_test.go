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
	b := newProgressBatch(3, 50*time.Millisecond)
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
	sent := b.take()
	b.add(t0.Add(20*time.Millisecond), 4, 5, 6)
	if b.due(t0.Add(time.Second)) || !b.wake().IsZero() || b.idle() {
		t.Fatal("a call in flight: another is due, or the batch wakes or is idle")
	}
	b.done(t0.Add(30*time.Millisecond), sent, true) // failed: its tokens go back in front
	if got := fmt.Sprint(b.take()); got != "[1 2 3 4 5 6]" {
		t.Fatalf("after a failed call the next one sends %s, want [1 2 3 4 5 6]", got)
	}
	b.done(t0.Add(40*time.Millisecond), nil, false)
	if !b.idle() {
		t.Fatal("a call ended and nothing waits: not idle")
	}
	if b := newProgressBatch(0, time.Second); !func() bool { b.add(t0, 7); return b.due(t0) }() {
		t.Fatal("every 0 is taken as 1: one token is due at once")
	}
}
