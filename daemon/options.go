package daemon

import (
	"time"

	"github.com/connex/connex/clock"
)

// Option changes how New assembles a daemon.
type Option func(*Daemon)

// WithClock makes the daemon, its directory and its hold, puller and
// request actors read the time and run their timers on c instead of the
// system clock (tests pass a clock.Fake). CONNEX_FAULT_CLOCK_SKEW applies
// only to the system clock, the default.
func WithClock(c clock.Clock) Option {
	return func(d *Daemon) { d.clock = clock.Or(c) }
}

// now is the daemon's clock's time.
func (d *Daemon) now() time.Time { return d.clock.Now() }
