package router

import (
	"sync"
	"sync/atomic"
	"time"
)

// retiredLeg is a decode leg the router gave up on (stalled, its engine
// left, its stream broke or failed) while the request resumes elsewhere. It
// stays open, its reader and its last health probe drained, until the
// resumed stream delivers its first token or the request ends (close).
//
// If a leg given up for a stall or because its engine left shows life
// meanwhile — a chunk or the end of its stream, or a 2xx answer to the
// health probe sent in its last silence — the resume is counted false
// (connex_router_false_resumes_total): the engine was late, not hung, and
// waiting for it would have been no slower than the resume that replaced
// it, which cost a pull and a recompute. A SIGSTOPped engine shows nothing
// and a killed one only a broken connection, so neither is counted; an
// engine that answered an error is alive but was not moved by mistake.
//
// What it sends meanwhile is kept: if it completes its answer (a clean
// [DONE], no error event nor an "abort" or "error" finish, on a leg not
// given up for an error it answered) before the resumed stream delivers
// anything, the router relays that answer instead (legSwitchBack): a late
// engine may finish the request and release its hold before the new
// engine's member moves it (at the router's grant) and fences it, and the
// new engine then has nothing to pull. One that finishes after the move
// is fenced: its answer is still relayed whole, and the hold is released
// by the new engine's request, or when the grant lapses if that engine
// never starts it.
type retiredLeg struct {
	s           *Server
	rid, reason string
	engine      string
	decided     time.Time
	abandon     func()
	events      <-chan legEvent
	probes      <-chan probeAnswer
	// probe is the health probe outstanding when the leg was given up: the
	// only one whose answer says the engine lived after its last token.
	probe int
	// judged: the leg was given up on a guess (stalled, engine_left), so
	// its life makes the resume false.
	judged bool
	stop   chan struct{}
	once   sync.Once
	life   atomic.Bool
	lifeAt atomic.Int64 // when life was first seen, Unix ns
	// finished is closed when the leg ended its answer cleanly: every
	// chunk it sent after it was given up is in chunks, none an error.
	finished chan struct{}
	mu       sync.Mutex
	chunks   []*engineChunk
	spoilt   bool // an error chunk, or more than maxRetiredChunks: no switch back
}

// maxRetiredChunks bounds what a given-up leg's answer may hold for a
// switch back (an answer's chunks are its tokens).
const maxRetiredChunks = 1 << 16

// retire starts watching a leg of request rid on engine given up at decided
// for reason, with health probe number probe outstanding (0: none).
func (s *Server) retire(rid, reason, engine string, decided time.Time, events <-chan legEvent, probes <-chan probeAnswer, probe int, abandon func()) *retiredLeg {
	r := &retiredLeg{s: s, rid: rid, reason: reason, engine: engine, decided: decided, abandon: abandon,
		stop: make(chan struct{}), events: events, probes: probes, probe: probe, finished: make(chan struct{}),
		judged: reason == "stalled" || reason == "engine_left",
		// A leg given up for an error it answered has no answer to
		// switch back to: the [DONE] after its error event ends that
		// error (relayed, it left the client an empty stream).
		spoilt: reason == "engine_error"}
	go r.watch()
	return r
}

// watch drains the leg's events and probe answers until stop, noting the
// first sign of life; a router that shuts down closes the leg at once.
func (r *retiredLeg) watch() {
	for {
		select {
		case <-r.stop:
			return
		case <-r.s.done:
			r.close()
			return
		case ev := <-r.events:
			switch {
			case ev.chunk != nil:
				r.alive()
				r.keep(ev.chunk)
			case ev.err == errDone:
				r.alive()
				r.mu.Lock()
				if !r.spoilt {
					close(r.finished)
				}
				r.mu.Unlock()
			}
		case a := <-r.probes:
			if a.alive && a.probe == r.probe && r.probe != 0 {
				r.alive()
			}
		}
	}
}

// keep adds a chunk the leg sent to its answer.
func (r *retiredLeg) keep(ch *engineChunk) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(ch.Error) > 0 && !isNull(ch.Error) || len(r.chunks) == maxRetiredChunks || abandonedFinish(ch) {
		r.spoilt, r.chunks = true, nil
	}
	if !r.spoilt {
		r.chunks = append(r.chunks, ch)
	}
}

// abandonedFinish reports whether ch ends its choice without an answer:
// vLLM's "abort" (the engine dropped the request) or "error".
func abandonedFinish(ch *engineChunk) bool {
	if len(ch.Choices) == 0 || ch.Choices[0].FinishReason == nil {
		return false
	}
	f := *ch.Choices[0].FinishReason
	return f == "abort" || f == "error"
}

// answer is the rest of the answer the leg sent after it was given up, once
// finished is closed.
func (r *retiredLeg) answer() []*engineChunk {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.chunks
}

func (r *retiredLeg) alive() {
	if r.judged && r.life.CompareAndSwap(false, true) {
		r.lifeAt.Store(r.s.clock.Now().UnixNano())
	}
}

// close stops the watch, closes the leg's connection and counts the resume
// false if the leg showed life. Idempotent.
func (r *retiredLeg) close() {
	r.once.Do(func() {
		close(r.stop)
		r.abandon()
		if !r.life.Load() {
			return
		}
		r.s.metrics.falseResumes.WithLabelValues(r.reason).Inc()
		r.s.log.Info("false resume: the decode leg given up showed life afterwards", "request_id", r.rid, "engine", r.engine,
			"reason", r.reason, "life_after", time.Duration(r.lifeAt.Load()-r.decided.UnixNano()).Round(time.Millisecond))
	})
}

// closeWhenAnswered closes a leg the router no longer needs once its engine
// has answered or failed (any event), at the latest after
// StallRule.FirstToken: an engine left while it starts the request (its
// request.start, a takeover, still in flight) may not see that its client
// left and keep the request, and the hold it renews, alive; one that has
// answered ends the request itself when its client goes.
func (s *Server) closeWhenAnswered(events <-chan legEvent, abandon func()) {
	t, expired := s.clock.NewTimer(s.cfg.Stall.FirstToken)
	go func() {
		defer t.Stop()
		select {
		case <-events:
		case <-expired:
		case <-s.done:
		}
		abandon()
	}()
}
