package router

import (
	"encoding/json"
	"net/http"
	"strings"
)

// emitter writes the client's answer in the shape of the endpoint it
// called, whatever engines and legs produced the tokens.
type emitter struct {
	w       http.ResponseWriter
	flusher http.Flusher
	c       *ClientRequest
	id      string
	created int64

	started bool // stream: headers and the first chunk are out
	text    strings.Builder
	ids     []uint32
	// textIDs is how many of ids the engines' text covers: the ids up to
	// the last chunk that carried text. vLLM withholds the text of a token
	// that ends inside a UTF-8 character (its detokenizer sends the ids
	// with empty text until the character completes), so ids past textIDs
	// end mid-character. A resume starts at textIDs (resumePoint).
	textIDs int
	// skipIDs is how many leading ids of the next leg to leave out: the
	// resumed engine regenerates the ids past textIDs, already relayed.
	skipIDs int
	finish  string
	connex  map[string]any
	// dropNext drops the next tokens relayed: a planted bug (plant_on.go).
	dropNext bool
	// stops, once a request resumed, applies its stop strings across the
	// resume (stopfilter.go); stopped: one matched, the answer is complete.
	stops   *stopFilter
	stopped bool
}

func newEmitter(w http.ResponseWriter, c *ClientRequest, id string, created int64) *emitter {
	f, _ := w.(http.Flusher)
	return &emitter{w: w, flusher: f, c: c, id: id, created: created, connex: map[string]any{}}
}

func (e *emitter) object(chunk bool) string {
	switch {
	case e.c.Kind == Chat && chunk:
		return "chat.completion.chunk"
	case e.c.Kind == Chat:
		return "chat.completion"
	}
	return "text_completion"
}

func (e *emitter) envelope(chunk bool) map[string]any {
	return map[string]any{"id": e.id, "object": e.object(chunk), "created": e.created, "model": e.c.Model}
}

func (e *emitter) send(v any) {
	b, _ := json.Marshal(v)
	_, _ = e.w.Write([]byte("data: "))
	_, _ = e.w.Write(b)
	_, _ = e.w.Write([]byte("\n\n"))
	if e.flusher != nil {
		e.flusher.Flush()
	}
}

// headers names the request and its engines for operators: the decode
// engine is the one streaming when the answer starts.
func (e *emitter) headers() {
	h := e.w.Header()
	h.Set("X-Connex-Request-Id", e.id)
	if p, ok := e.connex["prefill_engine"].(string); ok {
		h.Set("X-Connex-Prefill-Engine", p)
	}
	if ds, ok := e.connex["decode_engines"].([]string); ok && len(ds) > 0 {
		h.Set("X-Connex-Decode-Engine", ds[len(ds)-1])
	}
}

func (e *emitter) begin() {
	if e.started || !e.c.Stream {
		return
	}
	e.started = true
	e.headers()
	h := e.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	e.w.WriteHeader(http.StatusOK)
	if e.c.Kind == Chat {
		m := e.envelope(true)
		m["choices"] = []any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}}
		e.send(m)
	}
}

func (e *emitter) choice(text string, ids []uint32, finish *string) map[string]any {
	ch := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish}
	if e.c.Kind == Chat {
		ch["delta"] = map[string]any{"content": text}
	} else {
		ch["text"] = text
	}
	if e.c.ReturnTokenIDs {
		ch["token_ids"] = ids
	}
	return ch
}

// tokens relays new tokens (and a finish reason, if the engine ended).
func (e *emitter) tokens(text string, ids []uint32, finish *string) {
	if e.dropNext && (text != "" || len(ids) > 0) {
		e.dropNext = false
		return
	}
	if e.stopped {
		return
	}
	if e.skipIDs > 0 && len(ids) > 0 {
		n := min(e.skipIDs, len(ids))
		ids, e.skipIDs = ids[n:], e.skipIDs-n
	}
	engineText := text != ""
	if e.stops != nil {
		var matched bool
		if text, matched = e.stops.feed(text, finish != nil); matched {
			e.stopped = true
			stop := "stop"
			finish = &stop
		}
	}
	e.text.WriteString(text)
	e.ids = append(e.ids, ids...)
	if engineText && e.skipIDs == 0 {
		e.textIDs = len(e.ids)
	}
	if finish != nil {
		e.finish = *finish
	}
	if !e.c.Stream || (text == "" && len(ids) == 0 && finish == nil) {
		return
	}
	e.begin()
	m := e.envelope(true)
	m["choices"] = []any{e.choice(text, ids, finish)}
	e.send(m)
}

// resumePoint is the generated ids a resume sends with the prompt: those
// the text relayed so far covers. A token-id prompt that ends inside a
// UTF-8 character makes vLLM 0.32 stream the prompt's own text back
// (connector/vllm-cpu/partial_char_prompt.py), so the ids past textIDs —
// whose text the engine still withheld — are left to the resumed engine to
// generate again, and their ids, already relayed, are not relayed twice.
func (e *emitter) resumePoint() []uint32 {
	e.skipIDs = len(e.ids) - e.textIDs
	return e.ids[:e.textIDs]
}

func (e *emitter) usage(promptTokens int) map[string]int {
	return map[string]int{"prompt_tokens": promptTokens, "completion_tokens": len(e.ids), "total_tokens": promptTokens + len(e.ids)}
}

// done ends a successful answer.
func (e *emitter) done(promptTokens int) {
	if e.finish == "" {
		e.finish = "length"
	}
	if !e.c.Stream {
		m := e.envelope(false)
		ch := map[string]any{"index": 0, "logprobs": nil, "finish_reason": e.finish}
		if e.c.Kind == Chat {
			ch["message"] = map[string]any{"role": "assistant", "content": e.text.String()}
		} else {
			ch["text"] = e.text.String()
		}
		if e.c.ReturnTokenIDs {
			ch["token_ids"] = e.ids
		}
		m["choices"] = []any{ch}
		m["usage"] = e.usage(promptTokens)
		m["connex"] = e.connex
		e.headers()
		e.w.Header().Set("Content-Type", "application/json")
		b, _ := json.Marshal(m)
		_, _ = e.w.Write(b)
		return
	}
	e.begin()
	if e.c.IncludeUsage {
		// The usage chunk also carries the transfer record (the connex
		// object of a non-streamed answer): prefills, resumes, engines.
		m := e.envelope(true)
		m["choices"] = []any{}
		m["usage"] = e.usage(promptTokens)
		m["connex"] = e.connex
		e.send(m)
	}
	_, _ = e.w.Write([]byte("data: [DONE]\n\n"))
	if e.flusher != nil {
		e.flusher.Flush()
	}
}

// fail ends the answer with err: an error status and body if nothing was
// streamed yet, else an error event followed by [DONE].
func (e *emitter) fail(err *APIError) {
	if !e.started {
		writeError(e.w, err)
		return
	}
	e.w.Write([]byte("data: "))
	e.w.Write(err.body())
	e.w.Write([]byte("\n\ndata: [DONE]\n\n"))
	if e.flusher != nil {
		e.flusher.Flush()
	}
}
