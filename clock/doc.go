// Package clock is the time seam of connexd's actors and daemon: a Clock
// reads the time and starts timers, so that tests can drive timers by hand.
//
// Real is the system clock (the zero value is ready to use). Fake is a
// manual clock for tests: its time moves only when the test calls Advance,
// which runs every timer that falls due, in order of due time, on the
// caller's goroutine before it returns. A test can therefore advance the
// clock and know that every AfterFunc callback due by then has run (for an
// actor, that its timer message is in the mailbox).
//
// The package is pure: it starts no goroutine of its own (Real delegates to
// package time) and does no I/O.
package clock
