package clock

import "time"

// Real is the system clock, package time behind the Clock interface. Its
// zero value is ready to use.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// AfterFunc is time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// NewTimer is time.NewTimer.
func (Real) NewTimer(d time.Duration) (Timer, <-chan time.Time) {
	t := time.NewTimer(d)
	return t, t.C
}

// NewTicker is time.NewTicker.
func (Real) NewTicker(d time.Duration) (Ticker, <-chan time.Time) {
	t := time.NewTicker(d)
	return t, t.C
}

// Skewed is the system clock with its wall-clock readings shifted by Skew,
// as on a host whose clock is off (a fault test). Now keeps the monotonic
// reading, so durations measured with it and all its timers are those of
// the system clock.
type Skewed struct {
	Real
	Skew time.Duration
}

// Now returns time.Now().Add(Skew).
func (s Skewed) Now() time.Time { return time.Now().Add(s.Skew) }
