package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// legEvent is what the leg's reader goroutine reports.
type legEvent struct {
	resp  *upResponse
	chunk *engineChunk
	err   error // errDone at [DONE]
	// more: the next event has arrived already and is being read (tokens
	// that came together leave in one write to the client).
	more bool
	// relayEnded: the reader relayed a chunk after which the answer can
	// take no more (legShare.take's relayEnded).
	relayEnded bool
}

// probeAnswer is a health probe's answer: probe number and whether the
// engine answered 2xx.
type probeAnswer struct {
	probe int
	alive bool
}

// legWake is what woke a leg's goroutine.
type legWake int

const (
	wokeClientGone legWake = iota
	wokeShutdown
	wokePrevDone
	wokePoll
	wokeProbe
	wokeTimer
	wokeEvent
)

// leg runs one decode leg on e and relays its tokens to out. Its reader
// goroutine relays plain token chunks itself (legShare); this goroutine
// handles the rest and decides how the leg ends.
//
// prev, if not nil, is the leg given up before this one: if it finishes its
// answer before this leg delivered a token, the leg ends legSwitchBack.
func (s *Server) leg(ctx context.Context, rid string, e Engine, path string, body []byte, out *emitter, stall *Stall,
	onTokens func(time.Time), movable func() bool, prev *retiredLeg) legResult {
	id := e.Info.GetEngineId()
	untrack := s.track(id)
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	abandon := func() { cancel(); untrack() }
	events := make(chan legEvent, 16)
	// Health probes of a silent engine (probeHealth) answer on probed.
	probed := make(chan probeAnswer, 1)
	legStart := s.clock.Now()
	poll, pollC := s.clock.NewTicker(membershipPoll)
	defer poll.Stop()
	timer, timerC := s.clock.NewTimer(stall.Start(legStart).Sub(legStart))
	defer timer.Stop()
	arm := func(at time.Time) { timer.Reset(at.Sub(s.clock.Now())) }
	var prevDone <-chan struct{}
	if prev != nil {
		prevDone = prev.finished
	}
	answered := false // the engine answered (headers): it has started the request
	failed := func(reason string, err *APIError) legResult {
		return legResult{end: legFailed, reason: reason, err: err,
			retired: s.retire(rid, reason, id, s.clock.Now(), events, probed, stall.Outstanding(), abandon)}
	}
	sh := &legShare{relaying: true}
	// relayTokens hands a chunk's tokens to the emitter; under sh.mu, from
	// either goroutine.
	relayTokens := func(ch *engineChunk) {
		now := s.clock.Now()
		text, ids, fin := ch.text(), ch.Choices[0].TokenIDs, ch.Choices[0].FinishReason
		if chunkHasToken(ch) {
			sh.delivered = true // this leg delivers: no switch back
			s.heardFrom(id, now)
			if !out.replayed(len(ids)) { // a replay's tokens the client has are no tokens to it
				onTokens(now)
			}
			arm(stall.Token(now))
		}
		out.tokens(text, ids, fin, ch.extras())
	}
	sh.relay = func(ch *engineChunk, more bool) bool {
		relayTokens(ch)
		if out.stopped || out.failed != nil {
			return false
		}
		if !more {
			out.flush() // nothing more waits: what came leaves in one write
		}
		return true
	}
	// answerEnded ends a leg whose answer can take no more: a stop string
	// matched (across the resume: the answer is complete), or the engine
	// sent what the answer cannot hold (no resume).
	answerEnded := func() (legResult, bool) {
		switch {
		case out.stopped:
			abandon()
			return legResult{end: legDone}, true
		case out.failed != nil:
			return legResult{end: legRejected, err: out.failed, abandon: abandon}, true
		}
		return legResult{}, false
	}
	more := false // the last event said another one had arrived
	// turn handles what woke the leg, under sh.mu; it reports the leg's end.
	turn := func(woke legWake, ev legEvent, a probeAnswer) (legResult, bool) {
		if r, end := answerEnded(); end {
			// The reader's relay ended the answer and its relayEnded
			// event is on its way: whatever woke the leg first, it ends
			// as the answer says, not as a stall or a departure.
			return r, true
		}
		switch woke {
		case wokeClientGone:
			return legResult{end: legClientGone, abandon: abandon}, true
		case wokeShutdown:
			return legResult{end: legRejected, err: unavailable(CodeEngineFailed, "the router is shutting down"), abandon: abandon}, true
		case wokePrevDone:
			if sh.delivered {
				prevDone = nil // the reader delivered first: no switch back
				return legResult{}, false
			}
			if answered {
				return legResult{end: legSwitchBack, abandon: abandon}, true
			}
			// Its engine may be taking the request over right now: left
			// mid-start it could keep the request, and its hold, alive.
			return legResult{end: legSwitchBack, abandon: func() { s.closeWhenAnswered(events, abandon) }}, true
		case wokePoll:
			if !Has(s.cfg.Engines(), id) {
				return failed("engine_left", serverError(CodeEngineFailed, "decode engine %s left the cluster", id)), true
			}
			return legResult{}, false
		case wokeProbe:
			now := s.clock.Now()
			if a.alive {
				s.heardFrom(id, now)
			}
			arm(stall.Answer(a.probe, now, a.alive))
			return legResult{}, false
		case wokeTimer:
			if len(events) > 0 {
				arm(stall.Due()) // tokens already wait: read them first
				return legResult{}, false
			}
			step := stall.Check(s.clock.Now(), Heard{Engine: s.lastHeard(id), Others: s.othersHeard(id)})
			if step.Stalled && !movable() {
				// Nowhere to go: a slow engine beats an error.
				if next, kept := stall.Keep(s.clock.Now()); kept {
					arm(next)
					return legResult{}, false
				}
			}
			if step.Stalled {
				since := legStart
				if !stall.Last().IsZero() {
					since = stall.Last()
				}
				return failed("stalled", serverError(CodeEngineFailed, "decode engine %s sent no token for %s (stall window %s)",
					id, s.clock.Now().Sub(since).Round(time.Millisecond), stall.Window())), true
			}
			if step.Probe != 0 {
				// Ask the engine whether it lives before the deadline: a
				// starved engine answers, a hung one does not.
				go s.probeHealth(lctx, e.Info.GetBaseUrl(), stall.Window(), step.Probe, probed)
			}
			arm(step.Next)
			return legResult{}, false
		}
		switch {
		case ev.relayEnded:
			return answerEnded()
		case ev.resp != nil:
			answered = true // the engine took the request over
			return legResult{}, false
		case ev.err == errDone:
			abandon()
			return legResult{end: legDone}, true
		case ev.err != nil:
			var ae *APIError
			if errors.As(ev.err, &ae) {
				if ae.Status < 500 || ae.Code == CodeKVLoadFailed {
					return legResult{end: legRejected, err: ae, abandon: abandon}, true
				}
				return failed("engine_error", ae), true
			}
			return failed("broken", serverError(CodeEngineFailed, "decode engine %s: stream broke: %v", id, ev.err)), true
		}
		ch := ev.chunk
		more = ev.more
		if len(ch.Error) > 0 && !isNull(ch.Error) {
			ae := engineError(http.StatusBadGateway, append(append([]byte(`{"error":`), ch.Error...), '}'), id)
			if ae.Code == CodeKVLoadFailed {
				return legResult{end: legRejected, err: ae, abandon: abandon}, true
			}
			return failed("engine_error", ae), true
		}
		if len(ch.Connex) > 0 {
			var cx map[string]any
			if json.Unmarshal(ch.Connex, &cx) == nil {
				if kl, ok := cx["kv_load"].(string); ok {
					out.connex["kv_load"] = kl
					s.metrics.kvLoads.WithLabelValues(kvLoadLabel(kl)).Inc()
					if kl == "recomputed" {
						out.connex["prefills"] = 2
					}
				}
			}
		}
		if len(ch.Choices) == 0 {
			return legResult{}, false // usage: the router computes its own
		}
		relayTokens(ch)
		if sh.delivered {
			prevDone = nil
		}
		return answerEnded()
	}
	go s.readLeg(lctx, e.Info.GetBaseUrl()+path, body, id, events, sh)
	for {
		sh.mu.Lock()
		if sh.delivered {
			prevDone = nil
		}
		if len(events) == 0 && !more {
			out.flush() // nothing more waits: what came leaves in one write
		}
		sh.mu.Unlock()
		more = false
		var (
			woke legWake
			ev   legEvent
			a    probeAnswer
		)
		select {
		case <-ctx.Done():
			woke = wokeClientGone
		case <-s.done:
			woke = wokeShutdown
		case <-prevDone:
			woke = wokePrevDone
		case <-pollC:
			woke = wokePoll
		case a = <-probed:
			woke = wokeProbe
		case <-timerC:
			woke = wokeTimer
		case ev = <-events:
			woke = wokeEvent
		}
		sh.mu.Lock()
		if woke == wokeEvent {
			sh.queued--
		}
		res, end := turn(woke, ev, a)
		if end {
			sh.relaying = false // the reader never touches the leg's state again
			s.readerRelays.Add(int64(sh.relays))
		}
		sh.mu.Unlock()
		if end {
			return res
		}
	}
}

// chunkHasToken reports whether ch carries a token (its id or its text).
func chunkHasToken(ch *engineChunk) bool {
	return len(ch.Choices) > 0 && (len(ch.Choices[0].TokenIDs) > 0 || ch.text() != "")
}

// readLeg posts the leg and reports the response, each chunk, and how the
// stream ended on events, until ctx ends; while sh lets it, it relays plain
// token chunks itself (legShare).
func (s *Server) readLeg(ctx context.Context, url string, body []byte, id string, events chan<- legEvent, sh *legShare) {
	send := func(ev legEvent) bool {
		select {
		case events <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	resp, err := s.up.post(ctx, url, body, "text/event-stream")
	if err != nil {
		sh.sent(1)
		send(legEvent{err: err})
		return
	}
	defer resp.Body.Close()
	if resp.Status != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		sh.sent(1)
		send(legEvent{err: engineError(resp.Status, data, id)})
		return
	}
	sh.sent(1)
	if !send(legEvent{resp: resp}) {
		return
	}
	// Events that arrived together and go to the leg's goroutine are parsed
	// first and handed over in one burst: it takes them in one wake-up, not
	// one each.
	sse := newSSEReader(resp.Body)
	// Room for a whole short answer's burst without growing (the slice
	// stays on this goroutine's stack while it does not outgrow it).
	batch := make([]legEvent, 0, 24)
	for {
		ev := legEvent{}
		if data, err := sse.next(); err != nil {
			ev.err = err
		} else if ch, err := parseChunk(data); err != nil {
			ev.err = fmt.Errorf("engine %s sent an event that is not JSON: %v", id, err)
		} else {
			ev.chunk, ev.more = ch, sse.ready()
		}
		if len(batch) == 0 {
			switch sh.take(ev) {
			case relayed:
				continue
			case relayEnded:
				ev = legEvent{relayEnded: true}
			}
		}
		batch = append(batch, ev)
		if ev.more {
			continue
		}
		sh.sent(len(batch))
		for _, ev := range batch {
			if !send(ev) {
				return
			}
		}
		if ev.err != nil {
			return
		}
		batch = batch[:0]
	}
}

// probeHealth asks the engine at base whether it lives (GET /health, 2xx
// within timeout) and reports the answer to probe number probe on out,
// unless the leg (ctx) ended first.
func (s *Server) probeHealth(ctx context.Context, base string, timeout time.Duration, probe int, out chan<- probeAnswer) {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	alive := false
	if resp, err := s.up.get(pctx, base+"/health"); err == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		alive = resp.Status >= 200 && resp.Status < 300
	}
	select {
	case out <- probeAnswer{probe: probe, alive: alive}:
	case <-ctx.Done():
	}
}
