package router

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"
)

// A text prompt's length in tokens is known only to an engine's tokenizer,
// and a request whose prompt fits but whose prompt + max_tokens does not
// would otherwise be refused only after its prefill ran (relay.go checks
// again with the prefill's token ids). Before the prefill the router
// bounds the prompt from its bytes and, only when that bound does not
// prove the request fits, asks an engine of the model to count it
// (vLLM's POST /tokenize, which connex-sim serves too).

// tokenizeTimeout bounds that count; past it (or on any failure) the
// request goes on and the after-prefill check still refuses it.
const tokenizeTimeout = 2 * time.Second

// Slack added to a prompt's byte count for its upper bound in tokens:
// special tokens (BOS), and for chat the template's role markers per
// message. A byte-level tokenizer (vLLM's BPE models, connex-sim) makes at
// most one token per byte of text; a chat template adds its own text, which
// these cover for common templates — and when they do not, the
// after-prefill check still refuses the request, at the cost of a prefill.
const (
	promptSlackTokens     = 64
	chatSlackPerMessage   = 16
	maxCountedPromptBytes = 16 << 20
)

// promptText is a text prompt (completions: a string; chat: the messages
// array) and an upper bound of its tokens, for a request whose length is
// not known from token ids. ok is false for a prompt given as token ids or
// in a shape the router does not bound.
func promptText(c *ClientRequest) (field string, raw json.RawMessage, bound int, ok bool) {
	switch c.Kind {
	case Completions:
		var s string
		if json.Unmarshal(c.Body["prompt"], &s) != nil {
			return "", nil, 0, false
		}
		return "prompt", c.Body["prompt"], len(s) + promptSlackTokens, true
	case Chat:
		var msgs []json.RawMessage
		if json.Unmarshal(c.Body["messages"], &msgs) != nil {
			return "", nil, 0, false
		}
		// The raw JSON is longer than the text it carries (quotes, keys,
		// escapes): a bound, never an undercount of the content's bytes.
		return "messages", c.Body["messages"], len(c.Body["messages"]) + promptSlackTokens + chatSlackPerMessage*len(msgs), true
	}
	return "", nil, 0, false
}

// needsCount reports whether a request with a text prompt might not fit
// limit: its prompt's token bound plus max_tokens exceeds it. A request
// that surely fits, or whose length is known, needs no count.
func needsCount(c *ClientRequest, limit int) bool {
	if limit <= 0 || promptTokens(c) > 0 {
		return false
	}
	_, raw, bound, ok := promptText(c)
	if !ok || len(raw) > maxCountedPromptBytes {
		return false
	}
	return max(c.MaxTokens, 1) > limit-bound // not a sum: max_tokens may be near the int range
}

// countPrompt asks one live engine of the request's model (a prefill engine
// first: it tokenizes this prompt next anyway) for the prompt's length in
// tokens. 0 means not known (no engine, no /tokenize, an error: logged at
// debug), and the request goes on.
func (s *Server) countPrompt(ctx context.Context, c *ClientRequest, rid string) int {
	field, raw, _, _ := promptText(c)
	var target *Engine
	for _, e := range s.live() {
		if e.Info.GetModel() != c.Model || e.Info.GetBaseUrl() == "" {
			continue
		}
		if target == nil || (e.Info.GetRole() == "prefill" && target.Info.GetRole() != "prefill") {
			e := e
			target = &e
		}
	}
	if target == nil {
		return 0
	}
	body := map[string]json.RawMessage{"model": mustJSON(c.Model), field: raw}
	if c.Kind == Chat {
		body["add_generation_prompt"] = json.RawMessage("true")
		for _, k := range []string{"chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "tools"} {
			if v, ok := c.Body[k]; ok {
				body[k] = v
			}
		}
	}
	data, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(ctx, tokenizeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.Info.GetBaseUrl()+"/tokenize", bytes.NewReader(data))
	if err != nil {
		return 0
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		s.log.Debug("prompt length: tokenize failed; the prefill's count decides", "request_id", rid, "engine", target.Info.GetEngineId(), "err", err)
		return 0
	}
	defer resp.Body.Close()
	var out struct {
		Count int `json:"count"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&out) != nil || out.Count <= 0 {
		s.log.Debug("prompt length: the engine does not count it; the prefill's count decides", "request_id", rid, "engine", target.Info.GetEngineId(), "status", resp.StatusCode)
		return 0
	}
	return out.Count
}
