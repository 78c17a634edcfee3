package tcp

import (
	"context"
	"fmt"
	"time"
)

// A TCP connection that loses a segment and then its retransmission waits
// out the retransmission timer, doubled each time (200 ms, 400 ms, 800 ms…
// on Linux): under a few percent of packet loss one connection of an
// endpoint can go silent for over a second while its siblings flow, which is
// longer than a pull's stall deadline. A Get therefore watches the
// connections that carry its requests: one that has received nothing for
// Config.HedgeAfter since the Get's oldest request on it was sent is cut,
// and its requests are sent again on another connection (GETs are
// idempotent). The bytes the cut connection was receiving are wasted; a
// frozen holder gains nothing from it (the resent requests go unanswered
// too, and the Get ends with its context as before), and each Get cuts at
// most ConnsPerEndpoint connections.

// errConnSilent is why a Get cut a connection that went silent under its
// requests. Every Get with requests on it resends them without counting a
// try: the holder did nothing wrong.
var errConnSilent = fmt.Errorf("%w: silent under outstanding requests", errConnAborted)

// silentConns returns the connections carrying requests of inflight that have
// received nothing for longer than after (nanoseconds), counted from the
// later of their last receive and the oldest of those requests' sends. A
// connection whose requests are all answered in order is never silent for
// long: the holder streams them back to back.
func silentConns(inflight []*pendingReq, now, after int64) []*clientConn {
	oldest := make(map[*clientConn]int64)
	for _, r := range inflight {
		if r.conn == nil || r.sent == 0 {
			continue
		}
		if t, ok := oldest[r.conn]; !ok || r.sent < t {
			oldest[r.conn] = r.sent
		}
	}
	var silent []*clientConn
	for c, sent := range oldest {
		if now-max(c.lastRecv.Load(), sent) > after {
			silent = append(silent, c)
		}
	}
	return silent
}

// lastHeard is the newest receive (monoNow) on the connections carrying
// requests of inflight, 0 if none has any.
func lastHeard(inflight []*pendingReq) int64 {
	var last int64
	for _, r := range inflight {
		if r.conn != nil && r.sent != 0 {
			last = max(last, r.conn.lastRecv.Load())
		}
	}
	return last
}

// watchEvery is how often a Get with hedging off still looks for bytes
// arriving, to report them as progress.
const watchEvery = 75 * time.Millisecond

// cutSilent cuts c (when it is still usable) so that its requests come back
// with errConnSilent, and redials its slot in the background so that the
// resent requests and later Gets do not wait on a dial (a lost SYN costs a
// second). It reports whether it cut.
func (e *endpoint) cutSilent(c *clientConn, quiet time.Duration) bool {
	if !c.usable() {
		return false
	}
	e.b.log.Info("tcp: a connection to the holder went silent under its requests; resending them on another",
		"peer", e.addr, "silent_for", quiet.Round(time.Millisecond))
	c.abort(errConnSilent)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		return true
	}
	for i, s := range e.slots {
		if s == c {
			e.b.wg.Add(1)
			go e.redial(i)
		}
	}
	return true
}

// redialTimeout bounds a background redial: long enough for two lost SYNs.
const redialTimeout = 5 * time.Second

// redial dials slot i again, unless a Get did first; it gives up with the
// backend's close.
func (e *endpoint) redial(i int) {
	defer e.b.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), redialTimeout)
	defer cancel()
	go func() {
		select {
		case <-e.b.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	if _, err := e.conn(ctx, i); err != nil {
		e.b.log.Debug("tcp: background redial failed; the next Get dials", "peer", e.addr, "slot", i, "err", err)
	}
}

// liveSlot returns s, or another slot whose connection is usable when s's
// connection has failed, so that requests resent away from a cut connection
// do not wait for its redial.
func (e *endpoint) liveSlot(s int) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := e.slots[s]; c == nil || c.usable() {
		return s
	}
	for k := 1; k < len(e.slots); k++ {
		i := (s + k) % len(e.slots)
		if c := e.slots[i]; c != nil && c.usable() {
			return i
		}
	}
	return s
}
