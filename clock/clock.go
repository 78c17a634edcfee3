package clock

import "time"

// Clock reads the time and starts timers. Components take one in their
// dependencies instead of calling package time, so tests can pass a Fake.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// AfterFunc calls f after d, as time.AfterFunc does (on its own
	// goroutine for Real; on the goroutine that calls Advance for Fake).
	AfterFunc(d time.Duration, f func()) Timer
	// NewTimer returns a timer that sends the time on its channel after d,
	// as time.NewTimer does.
	NewTimer(d time.Duration) (Timer, <-chan time.Time)
	// NewTicker returns a ticker that sends the time on its channel every
	// d, as time.NewTicker does (d must be > 0); a slow reader misses
	// ticks rather than queueing them.
	NewTicker(d time.Duration) (Ticker, <-chan time.Time)
}

// Timer is a timer started by a Clock.
type Timer interface {
	// Stop prevents the timer from firing; it reports whether it did so
	// (false: it already fired or was stopped).
	Stop() bool
	// Reset makes the timer fire d from now (again); it reports whether
	// the timer was still pending.
	Reset(d time.Duration) bool
}

// Ticker is a ticker started by a Clock.
type Ticker interface {
	// Stop turns the ticker off; no tick is sent after it returns.
	Stop()
	// Reset changes the period to d and restarts the ticker from now.
	Reset(d time.Duration)
}

// Or returns c, or Real when c is nil: components whose dependencies leave
// the clock unset use the system clock.
func Or(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}
