package shim

import "time"

// progressBatch decides when a request's generated tokens are reported
// (request.progress): tokens accumulate off the token path and go out in
// one call, at most one call in flight, as soon as `every` tokens wait or
// the oldest waiting token is `delay` old. It is pure: callers pass the
// time.
type progressBatch struct {
	every    int
	delay    time.Duration
	pending  []uint32
	since    time.Time // when the oldest pending token arrived
	inFlight bool
}

func newProgressBatch(every int, delay time.Duration) *progressBatch {
	return &progressBatch{every: max(every, 1), delay: delay}
}

// add queues generated tokens.
func (b *progressBatch) add(now time.Time, toks ...uint32) {
	if len(toks) == 0 {
		return
	}
	if len(b.pending) == 0 {
		b.since = now
	}
	b.pending = append(b.pending, toks...)
}

// due reports whether a call should go out now.
func (b *progressBatch) due(now time.Time) bool {
	if b.inFlight || len(b.pending) == 0 {
		return false
	}
	return len(b.pending) >= b.every || !now.Before(b.since.Add(b.delay))
}

// wake is when due may next turn true on its own (the delay of the oldest
// pending token); zero when nothing waits or a call is in flight.
func (b *progressBatch) wake() time.Time {
	if b.inFlight || len(b.pending) == 0 {
		return time.Time{}
	}
	return b.since.Add(b.delay)
}

// take hands out the pending tokens for one call and marks it in flight.
func (b *progressBatch) take() []uint32 {
	out := b.pending
	b.pending = nil
	b.inFlight = true
	return out
}

// done records the end of the call in flight. A failed call (other than a
// fence, which ends the request) puts its tokens back in front, so the
// checkpoint never skips tokens.
func (b *progressBatch) done(now time.Time, sent []uint32, failed bool) {
	b.inFlight = false
	if failed && len(sent) > 0 {
		b.pending = append(sent, b.pending...)
		b.since = now
	}
}

// idle reports whether nothing waits and nothing is in flight.
func (b *progressBatch) idle() bool { return !b.inFlight && len(b.pending) == 0 }
