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
	enc     *json.Encoder // encodes events onto w
	dirty   bool          // written since the last flush
	head    []byte        // what every token event starts with (tokenEvent)
	buf     []byte        // the token event being written
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
	// reasoned: an engine's chunk carried reasoning (its reasoning parser
	// runs), which a resumed leg — a completion, no parser — cannot go on.
	reasoned bool
	// whole gathers a non-streamed answer's logprobs, reasoning and tool
	// calls (passthrough.go); nil until a chunk carries one.
	whole *answerExtras
	// replay, on a replayed leg, is how far it came (replay.go); sent is
	// the reasoning and tool calls the client has, which it compares.
	replay *replayCursor
	sent   *sentExtras
	// failed: the engine sent what the answer cannot hold (more extras
	// than maxExtrasBytes, or malformed ones); the relay ends the answer
	// with it.
	failed *APIError
}

func newEmitter(w http.ResponseWriter, c *ClientRequest, id string, created int64) *emitter {
	f, _ := w.(http.Flusher)
	return &emitter{w: w, flusher: f, enc: json.NewEncoder(w), c: c, id: id, created: created, connex: map[string]any{}}
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

// outChunk is one object of the client's answer: a streamed chunk, the
// usage chunk, or a whole non-streamed answer. A struct, not a map: its
// encoder is built once per process instead of sorting keys per token.
type outChunk struct {
	ID      string         `json:"id"`
	Object  string         `json:"object"`
	Created int64          `json:"created"`
	Model   string         `json:"model"`
	Choices []outChoice    `json:"choices"`
	Usage   *outUsage      `json:"usage,omitempty"`
	Connex  map[string]any `json:"connex,omitempty"`
}

// outChoice is a choice of outChunk in either endpoint's shape: text
// (completions), delta (a chat chunk) or message (a chat answer).
type outChoice struct {
	Index   int            `json:"index"`
	Text    *string        `json:"text,omitempty"`
	Delta   *outMessage    `json:"delta,omitempty"`
	Message *answerMessage `json:"message,omitempty"`
	// Logprobs are the engine's (passthrough.go); nil writes null.
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	TokenIDs     *[]uint32       `json:"token_ids,omitempty"`
}

// outMessage is a chat chunk's delta: the role (the first chunk) or the
// content. A delta with extras is written by event (tokenevent.go).
type outMessage struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type outUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func (e *emitter) envelope(chunk bool, choices ...outChoice) *outChunk {
	if choices == nil {
		choices = []outChoice{}
	}
	return &outChunk{ID: e.id, Object: e.object(chunk), Created: e.created, Model: e.c.Model, Choices: choices}
}

// send writes one event; it reaches the client at the next flush.
func (e *emitter) send(v *outChunk) {
	_, _ = e.w.Write([]byte("data: "))
	_ = e.enc.Encode(v) // the object and a newline
	_, _ = e.w.Write([]byte("\n"))
	e.dirty = true
}

// flush sends what was written to the client. The relay calls it when no
// more tokens wait: tokens that arrived together leave in one write.
func (e *emitter) flush() {
	if e.dirty && e.flusher != nil {
		e.flusher.Flush()
	}
	e.dirty = false
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
		e.send(e.envelope(true, outChoice{Delta: &outMessage{Role: "assistant"}}))
	}
}

// tokens relays new tokens (and a finish reason, if the engine ended),
// with the engine choice's extras x (logprobs, reasoning, tool calls;
// nil: none), which go out on the same chunk or into the whole answer.
func (e *emitter) tokens(text string, ids []uint32, finish *string, x *engineChoice) {
	if e.dropNext && (text != "" || len(ids) > 0) {
		e.dropNext = false
		return
	}
	if e.stopped || e.failed != nil {
		return
	}
	if x != nil && !e.carries(x) {
		x = nil
	}
	if e.replay != nil {
		var err error
		if text, ids, x, err = e.filterReplay(text, ids, x); err != nil {
			code, reason := CodeEngineFailed, ""
			if _, ok := err.(*errDiverged); ok {
				code, reason = CodeResumeRefused, " ("+RefuseDiverged+")"
			}
			e.failed = serverError(code, "decode engine %s, resuming the answer by replay: %v%s", e.decodeEngine(), err, reason)
			return
		}
	}
	if x != nil && e.c.Kind == Chat && (x.Delta.Reasoning != "" || x.Delta.ReasoningContent != "" || x.Delta.ToolCalls != "") {
		if err := e.sentX().keep(x); err != nil {
			e.failed = serverError(CodeEngineFailed, "decode engine %s: %v", e.decodeEngine(), err)
			return
		}
	}
	if x != nil && (x.Delta.Reasoning != "" || x.Delta.ReasoningContent != "") {
		e.reasoned = true // a reasoning parser split this answer: a resumed leg would not (resumeRefusal)
	}
	if x != nil && !e.c.Stream {
		e.gather(x)
		if e.failed != nil {
			return
		}
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
	if !e.c.Stream || (text == "" && len(ids) == 0 && finish == nil && x == nil) {
		return
	}
	e.begin()
	e.buf = e.event(e.buf[:0], text, ids, finish, x)
	_, _ = e.w.Write(e.buf)
	e.dirty = true
}

// resumePoint is the generated ids a resume sends with the prompt: those the
// text relayed so far covers. A token-id prompt that ends inside a UTF-8
// character makes vLLM 0.32 stream the prompt's own text back
// (engine/vllm-connector/vllm-cpu/partial_char_prompt.py), so the ids past
// textIDs — whose text the engine still withheld — are left to the resumed
// engine to generate again, and their ids, already relayed, are not relayed
// twice.
func (e *emitter) resumePoint() []uint32 {
	e.skipIDs = len(e.ids) - e.textIDs
	return e.ids[:e.textIDs]
}

func (e *emitter) usage(promptTokens int) *outUsage {
	return &outUsage{PromptTokens: promptTokens, CompletionTokens: len(e.ids), TotalTokens: promptTokens + len(e.ids)}
}

// done ends a successful answer.
func (e *emitter) done(promptTokens int) {
	if e.finish == "" {
		e.finish = "length"
	}
	if !e.c.Stream {
		text := e.text.String()
		ch := outChoice{FinishReason: &e.finish}
		if e.c.Kind == Chat {
			ch.Message = &answerMessage{Role: "assistant", Content: &text}
		} else {
			ch.Text = &text
		}
		if e.whole != nil {
			e.whole.fill(&ch, e.c)
		}
		if e.c.ReturnTokenIDs {
			ch.TokenIDs = &e.ids
		}
		m := e.envelope(false, ch)
		m.Usage, m.Connex = e.usage(promptTokens), e.connex
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
		m.Usage, m.Connex = e.usage(promptTokens), e.connex
		e.send(m)
	}
	// No flush: the handler returns next, and net/http sends what is
	// buffered with the end of the chunked body, in one write.
	_, _ = e.w.Write([]byte("data: [DONE]\n\n"))
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
	e.dirty = true
	e.flush()
}
