package cluster

import (
	"sync/atomic"
	"time"
)

// Activity says whether this member has work in hand (a request routed, a
// hold kept, a pull running): while it has, or had within a TTL, its
// Provider heartbeats at Config.HeartbeatInterval; otherwise at
// Config.IdleHeartbeatInterval. Give one to Config.Activity, Touch it
// wherever work arrives, and let inHand (NewActivity) say whether work
// that lasts is still going on; one Activity may serve the Providers of a
// member's successive joins. A Provider also counts itself busy while its
// load (SetLoad) is above zero. Safe for concurrent use; Touch is cheap
// enough for every request.
type Activity struct {
	inHand func() bool   // work that lasts is going on; nil: none
	epoch  time.Time     // monotonic origin of last
	last   atomic.Int64  // nanoseconds after epoch of the last Touch; 0: never
	idle   atomic.Bool   // a Provider beats at its idle interval now
	wake   chan struct{} // tells that Provider the member turned busy
}

// NewActivity returns an Activity that has seen no work yet. inHand, if
// not nil, is asked at every heartbeat whether work is going on now (live
// holds, running pulls, requests in flight); it must be quick and must not
// block.
func NewActivity(inHand func() bool) *Activity {
	return &Activity{inHand: inHand, epoch: time.Now(), wake: make(chan struct{}, 1)}
}

// working reports whether inHand says work is going on.
func (a *Activity) working() bool { return a.inHand != nil && a.inHand() }

// Touch records work in hand now. A Provider beating at its idle interval
// heartbeats at once and returns to the full rate. A nil Activity ignores
// it.
func (a *Activity) Touch() {
	if a == nil {
		return
	}
	a.last.Store(max(1, int64(time.Since(a.epoch))))
	if a.idle.Load() {
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
}

// lastTouch is when Touch was last called; zero if never.
func (a *Activity) lastTouch() time.Time {
	n := a.last.Load()
	if n == 0 {
		return time.Time{}
	}
	return a.epoch.Add(time.Duration(n))
}

// beatInterval picks a member's heartbeat interval: busy is the full rate
// for idleAfter past lastBusy (its last work in hand), idle past it; with
// no idle interval, always busy.
func beatInterval(busy, idle, idleAfter time.Duration, lastBusy, now time.Time) time.Duration {
	if idle <= 0 || now.Sub(lastBusy) < idleAfter {
		return busy
	}
	return idle
}
