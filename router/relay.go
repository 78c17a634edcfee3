package router

import (
	"context"
	"errors"
	"fmt"
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
			if res.retired != nil {
				// A leg that failed after its answer was whole: nothing
				// resumes, and its watcher would wait for a resumed
				// stream that never comes.
				res.retired.close()
			}
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
