package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"
)

// maxErrorBody bounds how much of an engine's error answer is read.
const maxErrorBody = 64 << 10

// membershipPoll is how often a running leg checks that its engine is still
// advertised (an engine whose connexd left the cluster is given up on).
const membershipPoll = 100 * time.Millisecond

// complete serves /v1/completions and /v1/chat/completions.
func (s *Server) complete(w http.ResponseWriter, r *http.Request, kind Kind) {
	if !allow(w, r, http.MethodPost) {
		return
	}
	leave, ok := s.admit.enter()
	if !ok {
		s.metrics.errors.WithLabelValues(CodeOverloaded).Inc()
		s.metrics.requests.WithLabelValues("unknown", kind.Path(), statusLabel(http.StatusServiceUnavailable)).Inc()
		w.Header().Set("Retry-After", strconv.Itoa(int(retryAfter/time.Second)))
		writeError(w, overloaded(s.cfg.MaxInFlight))
		return
	}
	defer leave()
	if s.cfg.Busy != nil {
		defer s.cfg.Busy()()
	}
	start := s.clock.Now()
	s.metrics.inFlight.Inc()
	defer s.metrics.inFlight.Dec()
	status, model := http.StatusOK, ""
	defer func() {
		s.metrics.requests.WithLabelValues(model, kind.Path(), statusLabel(status)).Inc()
		s.metrics.e2e.Observe(s.clock.Now().Sub(start).Seconds())
	}()
	reject := func(e *APIError) {
		status = e.Status
		s.metrics.errors.WithLabelValues(codeLabel(e.Code)).Inc()
		writeError(w, e)
	}
	data, err := readBody(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes), r.ContentLength, s.cfg.MaxBodyBytes)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			reject(&APIError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: CodeBodyTooLarge,
				Message: fmt.Sprintf("the body is larger than %d bytes (router_max_body_bytes)", s.cfg.MaxBodyBytes)})
			return
		}
		reject(badRequest("", "reading the body: %v", err))
		return
	}
	c, aerr := ParseClient(kind, data)
	if aerr != nil {
		reject(aerr)
		return
	}
	live := s.live()
	all, servable := Models(live)
	model = modelLabel(c.Model, all)
	if !servable[c.Model] {
		if contains(all, c.Model) {
			reject(unavailable(CodeNoEngine, "model %q has no live prefill and decode engine pair right now; retry later", c.Model))
		} else {
			reject(&APIError{Status: http.StatusNotFound, Type: "not_found_error", Code: CodeModelNotFound,
				Message: fmt.Sprintf("the model %q does not exist; GET /v1/models lists the models served", c.Model)})
		}
		return
	}
	limit := ContextLimit(live, c.Model)
	if e := CheckContext(c, promptTokens(c), limit); e != nil {
		reject(e)
		return
	}
	rid := newRequestID(kind)
	// A text prompt that may not leave room for max_tokens is counted by an
	// engine's tokenizer now, so it is refused before it costs a prefill.
	if needsCount(c, limit) {
		if n := s.countPrompt(r.Context(), c, rid); n > 0 {
			if e := CheckContext(c, n, limit); e != nil {
				reject(e)
				return
			}
		}
	}
	pre, aerr := s.prefill(r.Context(), c, rid)
	if aerr != nil && r.Context().Err() != nil {
		// Nothing to answer and no engine at fault (the prefill engine
		// releases a hold it made for nobody).
		status = statusClientClosed
		s.log.Info("client left during the prefill", "request_id", rid)
		return
	}
	if aerr != nil {
		s.log.Info("prefill failed", "request_id", rid, "code", aerr.Code, "err", aerr.Message)
		reject(aerr.redacted(""))
		return
	}
	// A text prompt's length is known now: a completion that does not fit
	// is refused before a decode engine refuses it, and the hold goes back.
	if e := CheckContext(c, len(pre.promptIDs), limit); e != nil {
		reject(e)
		s.releaseHold(pre, rid, endRejected)
		return
	}
	out := newEmitter(w, c, rid, start.Unix())
	out.connex["request_id"] = rid
	out.connex["prefill_engine"] = pre.engine
	out.connex["prefills"] = 1
	if e := s.decode(r.Context(), c, rid, pre, out, start); e == errClientGone {
		// Nobody to answer; the hold goes back unless a decode engine
		// bound it (its request actor frees it then).
		status = statusClientClosed
		s.log.Info("client left during the decode", "request_id", rid, "tokens_sent", len(out.ids))
		s.releaseHold(pre, rid, endClientGone)
		return
	} else if e != nil {
		status = e.Status
		s.metrics.errors.WithLabelValues(codeLabel(e.Code)).Inc()
		s.log.Warn("request failed", "request_id", rid, "code", e.Code, "err", e.Message)
		out.fail(e.redacted(transferOf(pre.params))) // the log above keeps the ids
		s.releaseHold(pre, rid, endReason(r.Context().Err() != nil, e))
		return
	}
	out.done(len(pre.promptIDs))
}

// errClientGone is decode's answer when the client left mid-request: no
// error to write, the hold to hand back.
var errClientGone = &APIError{Status: statusClientClosed, Message: "the client closed the connection"}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// legEnd is how one decode leg ended.
type legEnd int

const (
	legDone       legEnd = iota // [DONE] after a finish
	legClientGone               // the client went away
	legRejected                 // the engine refused the request: tell the client
	legFailed                   // broken, stalled, engine left or failed: resume elsewhere
	legSwitchBack               // the leg given up before finished its answer first: relay it
)

// legResult is one decode leg's outcome.
type legResult struct {
	end    legEnd
	err    *APIError
	reason string // resume reason for legFailed
	// abandon closes the leg's connection (legs that did not fail).
	abandon func()
	// retired is a failed leg, still open and watched for a sign of life
	// until the next leg has taken the request over and delivered
	// (retiredLeg): a live but stalled engine cannot finish the request and
	// release its hold before the takeover, and a resume away from a live
	// engine is counted.
	retired *retiredLeg
}

// decode runs decode legs until the request completes, moving it to
// another decode engine when a leg fails.
func (s *Server) decode(ctx context.Context, c *ClientRequest, rid string, pre *prefilled, out *emitter, start time.Time) *APIError {
	stall := &Stall{Rule: s.cfg.Stall}
	skip := map[string]bool{}
	var (
		pending   *retiredLeg // the failed leg still open
		failedAt  time.Time
		lastErr   string // why the last leg failed, for the answer when no engine is left
		firstSeen bool
		lastTok   time.Time
		decoders  []string
		// The emitter's state for the leg before this one (a switch back
		// to it restores them): its stop filter, the ids it still had to
		// skip (ones the leg before it relayed) and its replay cursor.
		prevStops  *stopFilter
		prevSkip   int
		prevReplay *replayCursor
	)
	m := newResumeMachine(s.cfg.MaxResumes) // what each leg sends, and what a leg's end calls for
	defer func() {
		if pending != nil {
			pending.close()
		}
	}()
	onTokens := func(now time.Time) {
		if !firstSeen {
			firstSeen = true
			s.metrics.ttft.Observe(now.Sub(start).Seconds())
		} else {
			s.metrics.itl.Observe(now.Sub(lastTok).Seconds())
		}
		if !failedAt.IsZero() {
			s.metrics.resumeGap.Observe(now.Sub(failedAt).Seconds())
			failedAt = time.Time{}
		}
		if pending != nil {
			pending.close() // the resumed stream delivers: judge the old leg
			pending = nil
		}
		lastTok = now
	}
	for {
		kind, resumes := m.Leg()
		if resumes > 0 && ctx.Err() != nil {
			return errClientGone // left between two legs: no grant, no leg for nobody
		}
		e, ok := Pick(s.live(), "decode", c.Model, s.busySnapshot(), skip)
		if !ok {
			if m.Step(resumeEvent{kind: evNoEngine}).code == CodeNoEngine {
				return unavailable(CodeNoEngine, "no live decode engine serves model %q", c.Model)
			}
			return unavailable(CodeResumeFailed, "request %s: its decode engine failed after %d tokens (%s) and no other live decode engine serves model %q", rid, len(out.ids), lastErr, c.Model)
		}
		id := e.Info.GetEngineId()
		skip[id] = true
		decoders = append(decoders, id)
		out.connex["decode_engines"] = decoders
		out.connex["resumes"] = resumes
		var grantTook time.Duration
		if resumes > 0 && s.cfg.Authorize != nil {
			t0 := s.clock.Now()
			if aerr := s.cfg.Authorize(ctx, e, rid); aerr != nil {
				if ctx.Err() != nil {
					return errClientGone // the grant was cut short by the client's leaving, not refused
				}
				s.log.Warn("resume: the engine's member refused the router's grant; trying another", "request_id", rid, "engine", id, "err", aerr)
				m.Step(resumeEvent{kind: evGrantRefused})
				continue
			}
			grantTook = s.clock.Now().Sub(t0)
		}
		var body []byte
		var err error
		prevStops, prevSkip, prevReplay = out.stops, out.skipIDs, out.replay
		switch kind {
		case legFirst:
			if !s.cfg.NoAssignSeed && needsSeed(c, e.Info.GetReasoningParser()) {
				seed := assignSeed(c, rand.Uint64())
				out.connex["seed"] = seed // the answer's record: the request can be sent again with it
				s.metrics.seeded.Inc()
				s.log.Debug("the request samples without a seed and resumes only by replay: the router seeds it", "request_id", rid, "seed", seed)
			}
			body, err = DecodeBody(c, pre.params, rid)
		case legReplay:
			// The client's request again, generated again from its first
			// token: the relay leaves out what the client has (replay.go).
			body, err = ReplayBody(c, pre.params, rid)
			out.startReplay()
		case legPrefix:
			if planted("second-prefill-on-resume") { // a planted bug (chaos harness tests only)
				if p2, perr := s.prefill(ctx, c, rid); perr == nil {
					pre = p2
					out.connex["prefills"] = out.connex["prefills"].(int) + 1
				}
			}
			if planted("drop-token-on-resume") { // a planted bug (chaos harness tests only)
				out.dropNext = true
			}
			gen := out.resumePoint()
			body, err = ResumeBody(c, pre.promptIDs, gen, pre.params, rid)
			if stops, include := stopStrings(c.Body); err == nil && len(stops) > 0 {
				out.stops = newStopFilter(stops, include, out.text.String(), s.withheld(ctx, e, c.Model, gen, out.text.String(), rid))
			}
		}
		if err != nil {
			return serverError(CodeResumeFailed, "request %s: %v", rid, err)
		}
		path := c.Kind.Path()
		if kind == legPrefix {
			path = Completions.Path()
		}
		// Whether a stalled leg could move: an engine not yet tried serves
		// the model.
		movable := func() bool {
			_, ok := Pick(s.live(), "decode", c.Model, s.busySnapshot(), skip)
			return ok
		}
		if resumes > 0 {
			// A resume is rare and worth a line: how long after the failure
			// its leg leaves, and what the grant took of that.
			s.log.Info("resumed leg sent", "request_id", rid, "engine", id, "replay", kind == legReplay,
				"since_failure_ms", s.clock.Now().Sub(failedAt).Milliseconds(), "grant_ms", grantTook.Milliseconds())
		}
		res := s.leg(ctx, rid, e, path, body, out, stall, onTokens, movable, pending)
		var refusal, why string
		if res.end == legFailed {
			refusal, why = resumeRefusal(c, out.reasoned, e.Info.GetReasoningParser())
		}
		// Replayable now: the router may have seeded the request at its first leg.
		eff := m.Step(resumeEvent{kind: evLegEnded, end: res.end, refusal: refusal, replayable: replayable(c), finished: out.finish != "" || out.stopped})
		switch eff.do {
		case actDone:
			return nil
		case actSwitchBack:
			// The given-up leg finished its answer while this one had sent
			// nothing: relay that answer, as the old engine's stream would
			// have been, and leave this leg.
			res.abandon()
			// The given-up leg's answer goes on where that leg was: its
			// stop filter, the ids it still had to skip (a leg resumed
			// inside a UTF-8 character regenerates ids the client has)
			// and its replay cursor, not the new leg's.
			out.stops, out.skipIDs, out.replay = prevStops, prevSkip, prevReplay
			s.log.Info("the decode leg given up finished its answer first; relaying it", "request_id", rid,
				"engine", pending.engine, "resumed_on", id)
			for _, ch := range pending.answer() {
				if len(ch.Choices) == 0 {
					continue
				}
				if chunkHasToken(ch) {
					onTokens(s.clock.Now())
				}
				out.tokens(ch.text(), ch.Choices[0].TokenIDs, ch.Choices[0].FinishReason, ch.extras())
				if out.stopped || out.failed != nil {
					break
				}
			}
			return out.failed
		case actClientGone:
			res.abandon()
			return errClientGone
		case actReject:
			res.abandon()
			if res.err.Code == CodeResumeRefused { // a replay that drew other tokens
				s.metrics.refused.WithLabelValues(RefuseDiverged).Inc()
			}
			return res.err
		}
		out.flush() // the tokens the failed leg relayed, before the resume's wait
		if pending != nil {
			pending.close() // a leg before this one: its successor failed too
		}
		pending = res.retired
		failedAt = s.clock.Now()
		lastErr = res.err.Message
		if eff.do == actRefuse {
			// Never a different answer: the client learns where its answer
			// ends and why, instead of a stream that goes on unlike itself.
			s.metrics.refused.WithLabelValues(refusal).Inc()
			s.log.Warn("decode leg failed; the request cannot be resumed exactly, ending it", "request_id", rid, "engine", id,
				"reason", refusal, "tokens_so_far", len(out.ids), "err", res.err.Message)
			return serverError(CodeResumeRefused, "request %s: its decode engine failed after %d tokens (%s) and it cannot be resumed into the same answer: %s, and it samples without a seed, so generating it again would draw other tokens (%s)",
				rid, len(out.ids), res.err.Message, why, refusal)
		}
		if eff.startReplay {
			s.log.Info("the request resumes by replay: generated again from its first token", "request_id", rid, "why", refusal)
		}
		if m.Replay() {
			s.metrics.replays.Inc()
		}
		s.metrics.resumes.WithLabelValues(res.reason).Inc()
		if eff.do == actFail {
			return serverError(CodeResumeFailed, "request %s: decode failed %d times (router_max_resumes=%d); last: %s", rid, resumes+1, s.cfg.MaxResumes, res.err.Message)
		}
		s.log.Warn("decode leg failed; resuming on another decode engine", "request_id", rid, "engine", id, "reason", res.reason,
			"tokens_so_far", len(out.ids), "err", res.err.Message)
	}
}

// legEvent is what the leg's reader goroutine reports.
type legEvent struct {
	resp  *upResponse
	chunk *engineChunk
	err   error // errDone at [DONE]
	// more: the next event has arrived already and is being read (tokens
	// that came together leave in one write to the client).
	more bool
}

// probeAnswer is a health probe's answer: probe number and whether the
// engine answered 2xx.
type probeAnswer struct {
	probe int
	alive bool
}

// leg runs one decode leg on e and relays its tokens to out.
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
	go s.readLeg(lctx, e.Info.GetBaseUrl()+path, body, id, events)
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
	more := false // the last event said another one had arrived
	for {
		if len(events) == 0 && !more {
			out.flush() // nothing more waits: what came leaves in one write
		}
		more = false
		select {
		case <-ctx.Done():
			return legResult{end: legClientGone, abandon: abandon}
		case <-s.done:
			return legResult{end: legRejected, err: unavailable(CodeEngineFailed, "the router is shutting down"), abandon: abandon}
		case <-prevDone:
			if answered {
				return legResult{end: legSwitchBack, abandon: abandon}
			}
			// Its engine may be taking the request over right now: left
			// mid-start it could keep the request, and its hold, alive.
			return legResult{end: legSwitchBack, abandon: func() { s.closeWhenAnswered(events, abandon) }}
		case <-pollC:
			if !Has(s.cfg.Engines(), id) {
				return failed("engine_left", serverError(CodeEngineFailed, "decode engine %s left the cluster", id))
			}
			continue
		case a := <-probed:
			now := s.clock.Now()
			if a.alive {
				s.heardFrom(id, now)
			}
			arm(stall.Answer(a.probe, now, a.alive))
			continue
		case <-timerC:
			if len(events) > 0 {
				arm(stall.Due()) // tokens already wait: read them first
				continue
			}
			step := stall.Check(s.clock.Now(), Heard{Engine: s.lastHeard(id), Others: s.othersHeard(id)})
			if step.Stalled && !movable() {
				// Nowhere to go: a slow engine beats an error.
				if next, kept := stall.Keep(s.clock.Now()); kept {
					arm(next)
					continue
				}
			}
			if step.Stalled {
				since := legStart
				if !stall.Last().IsZero() {
					since = stall.Last()
				}
				return failed("stalled", serverError(CodeEngineFailed, "decode engine %s sent no token for %s (stall window %s)",
					id, s.clock.Now().Sub(since).Round(time.Millisecond), stall.Window()))
			}
			if step.Probe != 0 {
				// Ask the engine whether it lives before the deadline: a
				// starved engine answers, a hung one does not.
				go s.probeHealth(lctx, e.Info.GetBaseUrl(), stall.Window(), step.Probe, probed)
			}
			arm(step.Next)
		case ev := <-events:
			switch {
			case ev.resp != nil:
				answered = true // the engine took the request over
				continue
			case ev.err == errDone:
				abandon()
				return legResult{end: legDone}
			case ev.err != nil:
				var ae *APIError
				if errors.As(ev.err, &ae) {
					if ae.Status < 500 || ae.Code == CodeKVLoadFailed {
						return legResult{end: legRejected, err: ae, abandon: abandon}
					}
					return failed("engine_error", ae)
				}
				return failed("broken", serverError(CodeEngineFailed, "decode engine %s: stream broke: %v", id, ev.err))
			}
			ch := ev.chunk
			more = ev.more
			if len(ch.Error) > 0 && !isNull(ch.Error) {
				ae := engineError(http.StatusBadGateway, append(append([]byte(`{"error":`), ch.Error...), '}'), id)
				if ae.Code == CodeKVLoadFailed {
					return legResult{end: legRejected, err: ae, abandon: abandon}
				}
				return failed("engine_error", ae)
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
				continue // usage: the router computes its own
			}
			now := s.clock.Now()
			text, ids, fin := ch.text(), ch.Choices[0].TokenIDs, ch.Choices[0].FinishReason
			if chunkHasToken(ch) {
				prevDone = nil // this leg delivers: no switch back
				s.heardFrom(id, now)
				if !out.replayed(len(ids)) { // a replay's tokens the client has are no tokens to it
					onTokens(now)
				}
				arm(stall.Token(now))
			}
			out.tokens(text, ids, fin, ch.extras())
			if out.stopped { // a stop string matched across the resume: the answer is complete
				abandon()
				return legResult{end: legDone}
			}
			if out.failed != nil { // the engine sent what the answer cannot hold: no resume
				return legResult{end: legRejected, err: out.failed, abandon: abandon}
			}
		}
	}
}

// chunkHasToken reports whether ch carries a token (its id or its text).
func chunkHasToken(ch *engineChunk) bool {
	return len(ch.Choices) > 0 && (len(ch.Choices[0].TokenIDs) > 0 || ch.text() != "")
}

// readLeg posts the leg and reports the response, each chunk, and how the
// stream ended on events, until ctx ends.
func (s *Server) readLeg(ctx context.Context, url string, body []byte, id string, events chan<- legEvent) {
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
		send(legEvent{err: err})
		return
	}
	defer resp.Body.Close()
	if resp.Status != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		send(legEvent{err: engineError(resp.Status, data, id)})
		return
	}
	if !send(legEvent{resp: resp}) {
		return
	}
	// Events that arrived together are parsed first and handed over in one
	// burst: the relay then takes them in one wake-up, not one each.
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
		batch = append(batch, ev)
		if ev.more {
			continue
		}
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
