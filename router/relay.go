package router

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	start := s.now()
	s.metrics.inFlight.Inc()
	defer s.metrics.inFlight.Dec()
	status, model := http.StatusOK, ""
	defer func() {
		s.metrics.requests.WithLabelValues(model, kind.Path(), statusLabel(status)).Inc()
		s.metrics.e2e.Observe(s.now().Sub(start).Seconds())
	}()
	reject := func(e *APIError) {
		status = e.Status
		s.metrics.errors.WithLabelValues(codeLabel(e.Code)).Inc()
		writeError(w, e)
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
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
	all, servable := Models(s.live())
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
	limit := ContextLimit(s.live(), c.Model)
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
	if e := s.decode(r.Context(), c, rid, pre, out, start); e != nil {
		status = e.Status
		s.metrics.errors.WithLabelValues(codeLabel(e.Code)).Inc()
		s.log.Warn("request failed", "request_id", rid, "code", e.Code, "err", e.Message)
		out.fail(e.redacted(transferOf(pre.params))) // the log above keeps the ids
		s.releaseHold(pre, rid, endReason(r.Context().Err() != nil, e))
		return
	}
	out.done(len(pre.promptIDs))
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// transferOf is the transfer id in a prefill's kv_transfer_params ("" if none).
func transferOf(params json.RawMessage) string {
	var kv struct {
		TransferID string `json:"transfer_id"`
	}
	_ = json.Unmarshal(params, &kv)
	return kv.TransferID
}

// prefilled is what the prefill leg produced.
type prefilled struct {
	engine    string
	params    json.RawMessage
	promptIDs []uint32
}

// prefill runs the prefill leg, on another prefill engine if the first
// cannot be reached or fails on its side.
func (s *Server) prefill(ctx context.Context, c *ClientRequest, rid string) (*prefilled, *APIError) {
	skip := map[string]bool{}
	body := PrefillBody(c)
	var last *APIError
	for attempt := 0; attempt < 2; attempt++ {
		e, ok := Pick(s.live(), "prefill", c.Model, s.busySnapshot(), skip)
		if !ok {
			break
		}
		id := e.Info.GetEngineId()
		skip[id] = true
		s.metrics.prefills.WithLabelValues(c.Model).Inc()
		p, err := s.prefillOn(ctx, e, c, body)
		if err == nil {
			// The transfer id goes to the log only: it names the hold every
			// decode leg pulls, which no client may learn (it would be the
			// handle of a takeover).
			s.log.Info("prefilled", "request_id", rid, "engine", id, "prompt_tokens", len(p.promptIDs), "transfer", transferOf(p.params))
			return p, nil
		}
		last = err
		if err.Status >= 400 && err.Status < 500 {
			return nil, err // the request itself is wrong: another engine says the same
		}
		if ctx.Err() != nil {
			// The client left: the engine did not fail, and no other
			// engine should prefill for nobody.
			return nil, err
		}
		s.log.Warn("prefill leg failed; trying another prefill engine", "request_id", rid, "engine", id, "err", err.Message)
	}
	if last == nil {
		last = unavailable(CodeNoEngine, "no live prefill engine serves model %q", c.Model)
	}
	return nil, last
}

func (s *Server) prefillOn(ctx context.Context, e Engine, c *ClientRequest, body []byte) (*prefilled, *APIError) {
	id := e.Info.GetEngineId()
	done := s.track(id)
	defer done()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PrefillTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.Info.GetBaseUrl()+c.Kind.Path(), bytes.NewReader(body))
	if err != nil {
		return nil, serverError(CodeEngineFailed, "prefill engine %s: %v", id, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, unavailable(CodeEngineFailed, "prefill engine %s unreachable: %v", id, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, unavailable(CodeEngineFailed, "prefill engine %s: reading its answer: %v", id, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, engineError(resp.StatusCode, data, id)
	}
	var ans struct {
		KVTransferParams json.RawMessage `json:"kv_transfer_params"`
		PromptTokenIDs   []uint32        `json:"prompt_token_ids"`
		Choices          []struct {
			PromptTokenIDs []uint32 `json:"prompt_token_ids"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(data, &ans); err != nil {
		return nil, serverError(CodeEngineFailed, "prefill engine %s answered something that is not a completion: %v", id, err)
	}
	if len(ans.KVTransferParams) == 0 || isNull(ans.KVTransferParams) {
		return nil, serverError(CodeEngineFailed, "prefill engine %s answered without kv_transfer_params: is it running with a kv_producer connector?", id)
	}
	p := &prefilled{engine: id, params: ans.KVTransferParams, promptIDs: ans.PromptTokenIDs}
	if len(p.promptIDs) == 0 && len(ans.Choices) > 0 {
		p.promptIDs = ans.Choices[0].PromptTokenIDs
	}
	return p, nil
}

// legEnd is how one decode leg ended.
type legEnd int

const (
	legDone       legEnd = iota // [DONE] after a finish
	legClientGone               // the client went away
	legRejected                 // the engine refused the request: tell the client
	legFailed                   // broken, stalled, engine left or failed: resume elsewhere
)

// legResult is one decode leg's outcome.
type legResult struct {
	end    legEnd
	err    *APIError
	reason string // resume reason for legFailed
	// abandon closes the leg's connection; called once the next leg has
	// taken the request over (so a live but stalled engine cannot finish the
	// request and release its hold before the takeover).
	abandon func()
}

// decode runs decode legs until the request completes, moving it to
// another decode engine when a leg fails.
func (s *Server) decode(ctx context.Context, c *ClientRequest, rid string, pre *prefilled, out *emitter, start time.Time) *APIError {
	stall := &Stall{Min: s.cfg.StallMin, Factor: s.cfg.StallFactor, FirstToken: s.cfg.FirstToken}
	skip := map[string]bool{}
	var (
		pending   func() // the failed leg still to abandon
		failedAt  time.Time
		lastErr   string // why the last leg failed, for the answer when no engine is left
		firstSeen bool
		lastTok   time.Time
		decoders  []string
	)
	defer func() {
		if pending != nil {
			pending()
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
		lastTok = now
	}
	for resumes := 0; ; resumes++ {
		e, ok := Pick(s.live(), "decode", c.Model, s.busySnapshot(), skip)
		if !ok {
			if resumes == 0 {
				return unavailable(CodeNoEngine, "no live decode engine serves model %q", c.Model)
			}
			return unavailable(CodeResumeFailed, "request %s: its decode engine failed after %d tokens (%s) and no other live decode engine serves model %q", rid, len(out.ids), lastErr, c.Model)
		}
		id := e.Info.GetEngineId()
		skip[id] = true
		decoders = append(decoders, id)
		out.connex["decode_engines"] = decoders
		out.connex["resumes"] = resumes
		var body []byte
		var err error
		if resumes == 0 {
			body, err = DecodeBody(c, pre.params, rid)
		} else {
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
			if err == nil && s.cfg.Authorize != nil {
				if aerr := s.cfg.Authorize(ctx, e, rid); aerr != nil {
					s.log.Warn("resume: the engine's member refused the router's grant; trying another", "request_id", rid, "engine", id, "err", aerr)
					continue
				}
			}
			if stops, include := stopStrings(c.Body); err == nil && len(stops) > 0 {
				out.stops = newStopFilter(stops, include, out.text.String(), s.withheld(ctx, e, c.Model, gen, out.text.String(), rid))
			}
		}
		if err != nil {
			return serverError(CodeResumeFailed, "request %s: %v", rid, err)
		}
		path := c.Kind.Path()
		if resumes > 0 {
			path = Completions.Path()
		}
		res := s.leg(ctx, e, path, body, out, stall, onTokens, &pending)
		switch res.end {
		case legDone:
			return nil
		case legClientGone:
			if res.abandon != nil {
				res.abandon()
			}
			return nil
		case legRejected:
			if res.abandon != nil {
				res.abandon()
			}
			return res.err
		}
		if pending != nil {
			pending()
		}
		pending = res.abandon
		failedAt = s.now()
		lastErr = res.err.Message
		s.metrics.resumes.WithLabelValues(res.reason).Inc()
		if resumes >= s.cfg.MaxResumes {
			return serverError(CodeResumeFailed, "request %s: decode failed %d times (router_max_resumes=%d); last: %s", rid, resumes+1, s.cfg.MaxResumes, res.err.Message)
		}
		s.log.Warn("decode leg failed; resuming on another decode engine", "request_id", rid, "engine", id, "reason", res.reason,
			"tokens_so_far", len(out.ids), "err", res.err.Message)
	}
}

// legEvent is what the leg's reader goroutine reports.
type legEvent struct {
	resp  *http.Response
	chunk *engineChunk
	err   error // errDone at [DONE]
}

// leg runs one decode leg on e and relays its tokens to out.
func (s *Server) leg(ctx context.Context, e Engine, path string, body []byte, out *emitter, stall *Stall,
	onTokens func(time.Time), pending *func()) legResult {
	id := e.Info.GetEngineId()
	untrack := s.track(id)
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	abandon := func() { cancel(); untrack() }
	events := make(chan legEvent, 16)
	go s.readLeg(lctx, e.Info.GetBaseUrl()+path, body, id, events)
	legStart := s.now()
	stall.Start(legStart)
	poll := time.NewTicker(membershipPoll)
	defer poll.Stop()
	timer := time.NewTimer(time.Until(stall.Deadline(legStart)))
	defer timer.Stop()
	failed := func(reason string, err *APIError) legResult {
		return legResult{end: legFailed, reason: reason, err: err, abandon: abandon}
	}
	stalled := func() legResult {
		since := legStart
		if !stall.Last().IsZero() {
			since = stall.Last()
		}
		return failed("stalled", serverError(CodeEngineFailed, "decode engine %s sent no token for %s (stall window %s)", id, s.now().Sub(since).Round(time.Millisecond), stall.Window()))
	}
	// A health probe of a silent engine (probeHealth) reports on probed;
	// probeFor is the last token when it was sent.
	probed := make(chan bool, 1)
	probing := false
	var probeFor time.Time
	for {
		select {
		case <-ctx.Done():
			return legResult{end: legClientGone, abandon: abandon}
		case <-s.done:
			return legResult{end: legRejected, err: unavailable(CodeEngineFailed, "the router is shutting down"), abandon: abandon}
		case <-poll.C:
			if !Has(s.cfg.Engines(), id) {
				return failed("engine_left", serverError(CodeEngineFailed, "decode engine %s left the cluster", id))
			}
			continue
		case alive := <-probed:
			probing = false
			if !stall.Last().Equal(probeFor) {
				// A token came meanwhile: the probe is moot; judge the
				// current gap afresh.
				timer.Reset(time.Until(stall.Deadline(legStart)))
				continue
			}
			if alive {
				// Silent but answering: CPU-starved, not hung.
				stall.Alive(s.now())
				timer.Reset(time.Until(stall.Deadline(legStart)))
				continue
			}
			return stalled()
		case <-timer.C:
			if !stall.Expired(legStart, s.now()) || len(events) > 0 {
				// The router itself was late (its lateness moved the
				// deadline), or tokens already wait: judge again then.
				timer.Reset(time.Until(stall.Deadline(legStart)))
				continue
			}
			if probing {
				continue // its answer decides
			}
			if stall.Probe() {
				// Ask the engine whether it lives before moving the
				// request: a starved engine answers, a hung one does not.
				probing, probeFor = true, stall.Last()
				go s.probeHealth(lctx, e.Info.GetBaseUrl(), stall.Window(), probed)
				continue
			}
			return stalled()
		case ev := <-events:
			switch {
			case ev.resp != nil:
				// The engine answered: it has taken the request over (the
				// takeover happens before it loads and answers), so the
				// leg that failed before may now be closed.
				if *pending != nil {
					(*pending)()
					*pending = nil
				}
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
			now := s.now()
			text, ids, fin := ch.text(), ch.Choices[0].TokenIDs, ch.Choices[0].FinishReason
			if len(ids) > 0 || text != "" {
				onTokens(now)
				stall.Token(now)
			}
			out.tokens(text, ids, fin)
			if out.stopped { // a stop string matched across the resume: the answer is complete
				abandon()
				return legResult{end: legDone}
			}
			timer.Reset(time.Until(stall.Deadline(legStart)))
		}
	}
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
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		send(legEvent{err: err})
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := s.client.Do(req)
	if err != nil {
		send(legEvent{err: err})
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		send(legEvent{err: engineError(resp.StatusCode, data, id)})
		return
	}
	if !send(legEvent{resp: resp}) {
		return
	}
	sse := newSSEReader(resp.Body)
	for {
		data, err := sse.next()
		if err != nil {
			send(legEvent{err: err})
			return
		}
		ch := new(engineChunk)
		if err := json.Unmarshal(data, ch); err != nil {
			send(legEvent{err: fmt.Errorf("engine %s sent an event that is not JSON: %v", id, err)})
			return
		}
		if !send(legEvent{chunk: ch}) {
			return
		}
	}
}

// probeHealth asks the engine at base whether it lives (GET /health, 2xx
// within timeout) and reports the answer on out, which has room for it.
func (s *Server) probeHealth(ctx context.Context, base string, timeout time.Duration, out chan<- bool) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	alive := false
	if req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/health", nil); err == nil {
		if resp, err := s.client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			alive = resp.StatusCode >= 200 && resp.StatusCode < 300
		}
	}
	out <- alive
}
