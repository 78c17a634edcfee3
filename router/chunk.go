package router

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/valyala/fastjson"
)

// engineChunk is what the router reads from one engine chunk (completions
// or chat, vLLM's shape with return_token_ids).
type engineChunk struct {
	Choices []engineChoice  `json:"choices"`
	Connex  json.RawMessage `json:"connex"`
	Error   json.RawMessage `json:"error"`
	// one holds the choice of a one-choice chunk (every chunk of an n=1
	// request) in the same allocation.
	one [1]engineChoice
}

// engineChoice is one choice of an engine chunk. Beside the text, ids and
// finish reason the router reads, it keeps what vLLM sends for the client
// alone — logprobs, a chat delta's reasoning and tool calls — as the
// engine's JSON (extraJSON), relayed as it is (passthrough.go).
type engineChoice struct {
	Text  string `json:"text"`
	Delta struct {
		Content *string `json:"content"`
		// Reasoning is vLLM's reasoning parser's output (vLLM 0.32
		// names it reasoning); ReasoningContent the name engines before
		// it, and others, use.
		Reasoning        extraJSON `json:"reasoning"`
		ReasoningContent extraJSON `json:"reasoning_content"`
		ToolCalls        extraJSON `json:"tool_calls"`
	} `json:"delta"`
	Logprobs     extraJSON `json:"logprobs"`
	TokenIDs     []uint32  `json:"token_ids"`
	FinishReason *string   `json:"finish_reason"`
}

// text is the chunk's new text, whatever the endpoint.
func (c *engineChunk) text() string {
	if len(c.Choices) == 0 {
		return ""
	}
	if c.Choices[0].Delta.Content != nil {
		return *c.Choices[0].Delta.Content
	}
	return c.Choices[0].Text
}

// Engine answers are read with fastjson, which parses without reflection
// and allocates nothing of its own per chunk (the relay's largest cost
// with encoding/json: 17 chunks per 16-token answer). It serves the common
// chunk — choices with text or delta content, token ids and a finish
// reason, all of the expected types, valid UTF-8 — and hands everything
// else (an error or connex object, whose raw bytes travel on, logprobs,
// reasoning or tool calls, relayed as the engine wrote them, a \u escape,
// a key in another case or twice, any type it does not expect) to
// encoding/json, so that what the
// router reads, and the errors it reports, are encoding/json's.
var jsonParsers fastjson.ParserPool

// parseChunk reads one engine chunk.
func parseChunk(data []byte) (*engineChunk, error) {
	p := jsonParsers.Get()
	ch, ok := fastChunk(p, data)
	jsonParsers.Put(p)
	if ok {
		return ch, nil
	}
	ch = new(engineChunk)
	if err := json.Unmarshal(data, ch); err != nil {
		return nil, err
	}
	if len(ch.Error) == 0 {
		ch.Error = flatError(data)
	}
	return ch, nil
}

// flatError is data itself if it is an error event in the flat form
// ({"object":"error","message":…,"type":…,"code":…}: vLLM before its
// nested {"error":{…}}, and other engines), read as the error's body; nil
// otherwise.
func flatError(data []byte) json.RawMessage {
	var head struct {
		Object string `json:"object"`
	}
	if json.Unmarshal(data, &head) != nil || head.Object != "error" {
		return nil
	}
	return bytes.Clone(data)
}

// fastChunk reads a common chunk; ok is false for anything else.
func fastChunk(p *fastjson.Parser, data []byte) (ch *engineChunk, ok bool) {
	v, ok := parseStrict(p, data)
	if !ok || v.Type() != fastjson.TypeObject || v.Exists("error") || v.Exists("connex") ||
		!plainKeys(v, "choices", "error", "connex", "object") || string(v.GetStringBytes("object")) == "error" {
		return nil, false
	}
	ch = &engineChunk{}
	cs := v.Get("choices")
	if cs == nil || cs.Type() == fastjson.TypeNull {
		return ch, true
	}
	arr, err := cs.Array()
	if err != nil {
		return nil, false
	}
	ch.Choices = ch.one[:]
	if len(arr) != 1 {
		ch.Choices = make([]engineChoice, len(arr))
	}
	for i, c := range arr {
		if !fastChoice(c, &ch.Choices[i]) {
			return nil, false
		}
	}
	return ch, true
}

func fastChoice(c *fastjson.Value, out *engineChoice) bool {
	if c.Type() == fastjson.TypeNull {
		return true
	}
	if c.Type() != fastjson.TypeObject || !plainKeys(c, "text", "delta", "token_ids", "finish_reason", "logprobs") ||
		!absent(c, "logprobs") {
		return false
	}
	var ok bool
	if out.Text, ok = fastString(c.Get("text")); !ok {
		return false
	}
	if d := c.Get("delta"); d != nil && d.Type() != fastjson.TypeNull {
		if d.Type() != fastjson.TypeObject || !plainKeys(d, "content", "reasoning", "reasoning_content", "tool_calls") ||
			!absent(d, "reasoning") || !absent(d, "reasoning_content") || !absent(d, "tool_calls") {
			return false
		}
		if cv := d.Get("content"); cv != nil && cv.Type() != fastjson.TypeNull {
			s, ok := fastString(cv)
			if !ok {
				return false
			}
			out.Delta.Content = &s
		}
	}
	if f := c.Get("finish_reason"); f != nil && f.Type() != fastjson.TypeNull {
		s, ok := fastString(f)
		if !ok {
			return false
		}
		out.FinishReason = &s
	}
	ids, err := fastTokenIDs(c.Get("token_ids"))
	if err != nil {
		return false
	}
	out.TokenIDs = ids
	return true
}

// absent reports whether object v has no key, or null, for key: a value
// there is an extra the encoding/json path keeps.
func absent(v *fastjson.Value, key string) bool {
	x := v.Get(key)
	return x == nil || x.Type() == fastjson.TypeNull
}

// plainKeys reports whether object v names each of the keys it reads at
// most once and exactly: encoding/json takes the last of repeated keys and
// matches a key whatever its case, fastjson's Get the first and exact.
func plainKeys(v *fastjson.Value, read ...string) bool {
	o, err := v.Object()
	if err != nil {
		return false
	}
	var seen [8]int
	plain := true
	o.Visit(func(key []byte, _ *fastjson.Value) {
		for i, k := range read {
			if string(key) == k {
				if seen[i]++; seen[i] > 1 {
					plain = false
				}
			} else if len(key) == len(k) && strings.EqualFold(string(key), k) {
				plain = false
			}
		}
	})
	return plain
}

// fastString is a string value ("" for none or null) if it is valid UTF-8
// (encoding/json replaces invalid bytes; the fallback does that).
func fastString(v *fastjson.Value) (string, bool) {
	if v == nil || v.Type() == fastjson.TypeNull {
		return "", true
	}
	b, err := v.StringBytes()
	if err != nil || !utf8.Valid(b) {
		return "", false
	}
	return string(b), true
}

// fastTokenIDs is an array of token ids (nil for none or null).
func fastTokenIDs(v *fastjson.Value) ([]uint32, error) {
	if v == nil || v.Type() == fastjson.TypeNull {
		return nil, nil
	}
	arr, err := v.Array()
	if err != nil {
		return nil, err
	}
	ids := make([]uint32, len(arr))
	for i, x := range arr {
		n, err := x.Uint64()
		if err != nil || n > math.MaxUint32 {
			return nil, fmt.Errorf("token id %s is not a uint32", x)
		}
		ids[i] = uint32(n)
	}
	return ids, nil
}

// tokenIDs is an array of token ids in an engine's answer (a prefill's
// prompt_token_ids: as long as the prompt), decoded with fastjson rather
// than element by element through reflection.
type tokenIDs []uint32

// UnmarshalJSON implements json.Unmarshaler.
func (t *tokenIDs) UnmarshalJSON(b []byte) error {
	p := jsonParsers.Get()
	defer jsonParsers.Put(p)
	v, err := p.ParseBytes(b)
	if err != nil {
		return err
	}
	ids, err := fastTokenIDs(v)
	if err != nil {
		return fmt.Errorf("token ids: %w", err)
	}
	*t = ids
	return nil
}
