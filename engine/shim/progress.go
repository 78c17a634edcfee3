package shim

import "time"

// progressBatch decides when a request's generated tokens are reported
// (request.progress): tokens accumulate off the token path and go out in
// one call, at most one call in flight, as soon as `every` tokens wait or
// the oldest waiting token is `delay` old — but never sooner than
// `interval` after the previous call went out, so that a fast engine's
// checkpoints (each a durable write of the request's record) come at a
// bounded rate per request rather than one every few tokens. It is pure:
// callers pass the time.
type progressBatch struct {
	every    int
	delay    time.Duration
	interval time.Duration
	pending  []uint32
	since    time.Time // when the oldest pending token arrived
	last     time.Time // when the last call went out; zero before the first
	inFlight bool
}

func newProgressBatch(every int, delay, interval time.Duration) *progressBatch {
	return &progressBatch{every: max(every, 1), delay: delay, interval: max(interval, 0)}
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
	if b.inFlight || len(b.pending) == 0 || now.Before(b.next()) {
		return false
	}
	return len(b.pending) >= b.every || !now.Before(b.since.Add(b.delay))
}

// next is the earliest a call may go out: interval after the last one.
func (b *progressBatch) next() time.Time {
	if b.last.IsZero() {
		return time.Time{}
	}
	return b.last.Add(b.interval)
}

// wake is when due may next turn true on its own (the delay of the oldest
// pending token, or the end of the interval since the last call); zero
// when nothing waits or a call is in flight.
func (b *progressBatch) wake() time.Time {
	if b.inFlight || len(b.pending) == 0 {
		return time.Time{}
	}
	at := b.next()
	if len(b.pending) < b.every {
		at = later(at, b.since.Add(b.delay))
	}
	return at
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// take hands out the pending tokens for one call, sent now, and marks it
// in flight.
func (b *progressBatch) take(now time.Time) []uint32 {
	out := b.pending
	b.pending = nil
	b.inFlight = true
	b.last = now
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

// discard drops the tokens waiting: the request's reports stopped
// (fenced, or its actor gone), and none will be sent.
func (b *progressBatch) discard() { b.pending = nil }

// idle reports whether nothing waits and nothing is in flight.
func (b *progressBatch) idle() bool { return !b.inFlight && len(b.pending) == 0 }
