package simengine

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// ConnexInfo is the "connex" object on every response (non-stream: top
// level; stream: the first chunk): how the engine got the KV.
type ConnexInfo struct {
	// KVLoad is "pulled" (KV loaded from the hold), "recomputed" (the load
	// failed and policy recompute prefilled locally) or "local" (no
	// remote KV: a plain request or a prefill leg).
	KVLoad           string `json:"kv_load"`
	LoadedTokens     int    `json:"loaded_tokens"`
	RecomputedTokens int    `json:"recomputed_tokens"`
	Prefills         int    `json:"prefills"`
	EngineID         string `json:"engine_id"`
	// LoadError says why the load failed when KVLoad is "recomputed".
	LoadError string `json:"load_error,omitempty"`
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

type completionChoice struct {
	Index          int      `json:"index"`
	Text           string   `json:"text"`
	Logprobs       any      `json:"logprobs"`
	FinishReason   *string  `json:"finish_reason"`
	StopReason     any      `json:"stop_reason"`
	PromptTokenIDs []uint32 `json:"prompt_token_ids,omitempty"`
	TokenIDs       []uint32 `json:"token_ids,omitempty"`
}

type chatMessage struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatMessage `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
	StopReason   any          `json:"stop_reason,omitempty"`
	TokenIDs     []uint32     `json:"token_ids,omitempty"`
}

type response struct {
	ID               string          `json:"id"`
	Object           string          `json:"object"`
	Created          int64           `json:"created"`
	Model            string          `json:"model"`
	Choices          any             `json:"choices"`
	Usage            *usage          `json:"usage,omitempty"`
	PromptTokenIDs   []uint32        `json:"prompt_token_ids,omitempty"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
	Connex           *ConnexInfo     `json:"connex,omitempty"`
}

// output turns generated tokens into a response: one JSON body, or
// server-sent events flushed one chunk at a time.
type output struct {
	w       http.ResponseWriter
	g       *genRequest
	id      string
	created int64
	connex  *ConnexInfo
	params  json.RawMessage // kv_transfer_params to return (prefill leg)
	started bool            // stream: headers and the first chunk sent
	toks    []uint32
}

var finishLength = "length"

func (o *output) object() string {
	switch {
	case o.g.chat && o.g.stream:
		return "chat.completion.chunk"
	case o.g.chat:
		return "chat.completion"
	}
	return "text_completion"
}

func (o *output) base() response {
	return response{ID: o.id, Object: o.object(), Created: o.created, Model: o.g.model}
}

func (o *output) ids(t []uint32) []uint32 {
	if !o.g.tokenIDs {
		return nil
	}
	if t == nil {
		return []uint32{}
	}
	return t
}

// event writes one SSE event and flushes it.
func (o *output) event(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(o.w, "data: %s\n\n", b); err != nil {
		return err
	}
	if f, ok := o.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

// begin starts a stream: headers, then the first chunk (prompt token ids,
// the connex object; chat: the assistant role).
func (o *output) begin() error {
	if !o.g.stream {
		return nil
	}
	h := o.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	o.w.WriteHeader(http.StatusOK)
	o.started = true
	if !o.g.chat {
		return nil // completions: the first token chunk carries them
	}
	r := o.base()
	empty := ""
	r.Choices = []chatChoice{{Delta: &chatMessage{Role: "assistant", Content: &empty}, TokenIDs: o.ids(nil)}}
	if o.g.tokenIDs {
		r.PromptTokenIDs = o.g.tokens
	}
	r.Connex = o.connex
	return o.event(r)
}

// token emits one generated token (stream) or keeps it (non-stream).
func (o *output) token(t uint32, last bool) error {
	first := len(o.toks) == 0
	o.toks = append(o.toks, t)
	if !o.g.stream {
		return nil
	}
	var fin *string
	if last {
		fin = &finishLength
	}
	r := o.base()
	text := TokenText(t)
	if o.g.chat {
		r.Choices = []chatChoice{{Delta: &chatMessage{Content: &text}, FinishReason: fin, TokenIDs: o.ids([]uint32{t})}}
	} else {
		c := completionChoice{Text: text, FinishReason: fin, TokenIDs: o.ids([]uint32{t})}
		if first {
			if o.g.tokenIDs {
				c.PromptTokenIDs = o.g.tokens
			}
			r.Connex = o.connex
		}
		r.Choices = []completionChoice{c}
	}
	if last {
		r.KVTransferParams = o.params
	}
	return o.event(r)
}

func (o *output) usage() *usage {
	return &usage{PromptTokens: len(o.g.tokens), CompletionTokens: len(o.toks), TotalTokens: len(o.g.tokens) + len(o.toks)}
}

// end finishes the response: the usage chunk and [DONE] of a stream, or the
// whole body.
func (o *output) end() error {
	if o.g.stream {
		if o.g.includeUsage {
			r := o.base()
			r.Usage = o.usage()
			if o.g.chat {
				r.Choices = []chatChoice{}
			} else {
				r.Choices = []completionChoice{}
			}
			if err := o.event(r); err != nil {
				return err
			}
		}
		return o.done()
	}
	text, _ := Decode(o.toks)
	r := o.base()
	r.Usage = o.usage()
	r.KVTransferParams = o.params
	r.Connex = o.connex
	if o.g.chat {
		r.Choices = []chatChoice{{Message: &chatMessage{Role: "assistant", Content: &text}, FinishReason: &finishLength, TokenIDs: o.ids(o.toks)}}
		if o.g.tokenIDs {
			r.PromptTokenIDs = o.g.tokens
		}
	} else {
		c := completionChoice{Text: text, FinishReason: &finishLength, TokenIDs: o.ids(o.toks)}
		if o.g.tokenIDs {
			c.PromptTokenIDs = o.g.tokens
		}
		r.Choices = []completionChoice{c}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	o.w.Header().Set("Content-Type", "application/json")
	o.w.WriteHeader(http.StatusOK)
	_, err = o.w.Write(b)
	return err
}

func (o *output) done() error {
	if _, err := fmt.Fprint(o.w, "data: [DONE]\n\n"); err != nil {
		return err
	}
	if f, ok := o.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

// fail reports e: an error body before the stream started, an error event
// and [DONE] after.
func (o *output) fail(e *httpError) {
	if !o.started {
		writeError(o.w, e)
		return
	}
	_, _ = o.w.Write(append(append([]byte("data: "), e.body()...), "\n\n"...))
	_ = o.done()
}

func writeError(w http.ResponseWriter, e *httpError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(e.body())
}
