package daemon

import (
	"sync"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/errcode"
)

// startWait is how long a pull with await_start waits for its
// request.start to arrive. The engine sends both at once, so a start not
// seen by then was lost (its call failed before it reached this member):
// the pull fails rather than keep its destination blocks. A start that
// arrived is waited for until it ends, within the pull's own timeout.
const startWait = 5 * time.Second

// maxStartID bounds a start's id (StartRequestMsg.start_id,
// StartPullRequest.await_start).
const maxStartID = 64

// startKeep is how long a start's outcome is remembered for pulls that
// come after its answer (the usual order: pull.start leaves the engine's
// worker a step after request.start left its scheduler).
const startKeep = time.Minute

// maxKeptPerEngine bounds the outcomes remembered for one engine (one per
// request.start with a start id in the last startKeep: 68 a second). An
// engine past it (starts with no pull after them) has its further outcomes
// told only to pulls already waiting: its own later pulls time out, and no
// engine can fill a member's memory with them.
const maxKeptPerEngine = 4096

// startGate lets a pull wait for its request's start on this member
// (StartPullRequest.await_start). A hold is bound to the engine that
// starts its request, or takes it over at a resume, and a bound hold
// serves only its engine: a pull must not read before its request's
// start is answered. An engine that sends pull.start beside
// request.start, rather than a step after the answer, has connexd do the
// waiting: the pull reads as soon as the start ends, or fails with the
// start's error.
//
// Outcomes are keyed by engine, transfer and the start's id
// (StartRequestMsg.start_id, one per leg: a takeover's start names the
// same transfer as the first leg's, and an engine may run a request
// twice). The engine is the one the caller's credentials act for on both
// calls, so one engine's starts never open or fail another's pulls.
// startGate decides only; its callbacks run on the goroutine of the call
// that settles them (end, the clock's timer, close).
type startGate struct {
	clock clock.Clock
	mu    sync.Mutex
	m     map[gateKey]*gateEntry
	// ended lists keys in the order their outcomes were recorded, with
	// when, so outcomes older than startKeep are dropped cheaply.
	ended []gateEnd
	// kept counts the outcomes remembered per engine (maxKeptPerEngine).
	kept   map[string]int
	closed bool
}

// gateKey names the start a pull waits for: its engine, transfer and id.
type gateKey struct{ engine, transfer, start string }

type gateEntry struct {
	inflight int       // starts begun and not yet ended
	known    bool      // an outcome is recorded
	err      error     // the latest start's outcome
	at       time.Time // when it was recorded
	waiters  map[*gateWaiter]struct{}
}

type gateEnd struct {
	key gateKey
	at  time.Time
}

type gateWaiter struct {
	fn       func(error)
	timer    clock.Timer
	deadline time.Time // the pull's own: no longer, even for a start in flight
}

func newStartGate(c clock.Clock) *startGate {
	return &startGate{clock: clock.Or(c), m: map[gateKey]*gateEntry{}, kept: map[string]int{}}
}

// begin records that request.start id of transfer by engine is being
// handled: pulls that come now wait for its outcome.
func (g *startGate) begin(engine, transfer, id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entry(gateKey{engine, transfer, id})
	e.inflight++
}

// end records the outcome of a start begun with begin (err nil: answered
// running) and settles the pulls waiting for it.
func (g *startGate) end(engine, transfer, id string, err error) {
	key := gateKey{engine, transfer, id}
	g.mu.Lock()
	now := g.clock.Now()
	e := g.entry(key)
	if e.inflight > 0 {
		e.inflight--
	}
	var settle map[*gateWaiter]struct{}
	if e.inflight == 0 {
		settle, e.waiters = e.waiters, nil
	}
	g.expire(now)
	if e.known || g.kept[engine] < maxKeptPerEngine {
		if !e.known {
			g.kept[engine]++
		}
		e.known, e.err, e.at = true, err, now
		g.ended = append(g.ended, gateEnd{key, now})
	} else {
		g.drop(key, e) // told to the pulls waiting now, not kept
	}
	g.mu.Unlock()
	for w := range settle {
		w.timer.Stop()
		w.fn(startOutcome(err))
	}
}

// await calls fn once start id of transfer by engine is settled: at once
// with the outcome of one answered within startKeep, else when it ends,
// or with a timeout error when it has not arrived within startWait or has
// not ended within maxWait. fn may run before await returns.
func (g *startGate) await(engine, transfer, id string, maxWait time.Duration, fn func(error)) {
	key := gateKey{engine, transfer, id}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		fn(api.Errorf(api.CodePeerUnavailable, "connexd is stopping"))
		return
	}
	now := g.clock.Now()
	g.expire(now)
	e := g.entry(key)
	if e.inflight == 0 && e.known {
		err := e.err
		g.mu.Unlock()
		fn(startOutcome(err))
		return
	}
	w := &gateWaiter{fn: fn, deadline: now.Add(maxWait)}
	if e.waiters == nil {
		e.waiters = map[*gateWaiter]struct{}{}
	}
	e.waiters[w] = struct{}{}
	w.timer = g.clock.AfterFunc(min(startWait, maxWait), func() { g.timeout(key, w) })
	g.mu.Unlock()
}

// timeout fails w if nothing settled it first; while its start is in
// flight it waits on, up to w's deadline.
func (g *startGate) timeout(key gateKey, w *gateWaiter) {
	g.mu.Lock()
	e := g.m[key]
	if e == nil {
		g.mu.Unlock()
		return
	}
	if _, waiting := e.waiters[w]; !waiting {
		g.mu.Unlock()
		return
	}
	now := g.clock.Now()
	if left := w.deadline.Sub(now); e.inflight > 0 && left > 0 {
		w.timer = g.clock.AfterFunc(left, func() { g.timeout(key, w) })
		g.mu.Unlock()
		return
	}
	inflight := e.inflight > 0
	delete(e.waiters, w)
	g.drop(key, e)
	g.mu.Unlock()
	if inflight {
		w.fn(api.Errorf(api.CodeTimeout, "request.start %q of transfer %s by engine %s was still running at the pull's deadline (await_start)", key.start, key.transfer, key.engine))
		return
	}
	w.fn(api.Errorf(api.CodeTimeout, "no request.start %q of transfer %s by engine %s reached this member within %s of its pull.start (await_start)", key.start, key.transfer, key.engine, startWait))
}

// close fails every waiting pull and every later await (connexd
// stopping).
func (g *startGate) close() {
	g.mu.Lock()
	g.closed = true
	var all []*gateWaiter
	for _, e := range g.m {
		for w := range e.waiters {
			all = append(all, w)
		}
		e.waiters = nil
	}
	g.mu.Unlock()
	for _, w := range all {
		w.timer.Stop()
		w.fn(api.Errorf(api.CodePeerUnavailable, "connexd is stopping"))
	}
}

// entry returns key's entry, created empty. Caller holds mu.
func (g *startGate) entry(key gateKey) *gateEntry {
	e := g.m[key]
	if e == nil {
		e = &gateEntry{}
		g.m[key] = e
	}
	return e
}

// expire forgets outcomes recorded before now-startKeep whose entries
// nothing waits on. Caller holds mu.
func (g *startGate) expire(now time.Time) {
	n := 0
	for n < len(g.ended) && now.Sub(g.ended[n].at) > startKeep {
		old := g.ended[n]
		if e := g.m[old.key]; e != nil && e.known && !e.at.After(old.at) {
			e.known, e.err = false, nil
			if g.kept[old.key.engine]--; g.kept[old.key.engine] <= 0 {
				delete(g.kept, old.key.engine)
			}
			g.drop(old.key, e)
		}
		n++
	}
	if n > 0 {
		g.ended = g.ended[n:]
	}
}

// drop deletes key's entry once it holds nothing. Caller holds mu.
func (g *startGate) drop(key gateKey, e *gateEntry) {
	if e.inflight == 0 && !e.known && len(e.waiters) == 0 {
		delete(g.m, key)
	}
}

// startOutcome is what a waiting pull is told of its start's err.
func startOutcome(err error) error {
	if err == nil {
		return nil
	}
	e := errcode.AsError(err) // the code the start's caller got
	return api.Errorf(e.Code, "its request.start failed: %s", e.Msg)
}
