package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Beside its text and token ids, a decode engine's chunk may carry what
// the client alone reads: logprobs (completions: an object of lists,
// tokens, token_logprobs, top_logprobs, text_offset; chat: {"content":
// [...]}), and in a chat delta the output of vLLM's reasoning parser
// (reasoning; reasoning_content before vLLM 0.32 and in other engines) and
// of its tool parser or forced tool choice (tool_calls, with finish_reason
// "tool_calls"). The router relays them as the engine wrote them: a
// streamed chunk goes out with the extras of the engine chunk it came
// from, and a non-streamed answer gathers them from the streamed decode
// leg (answerExtras). Chunks without any keep the fast path (chunk.go,
// tokenevent.go) and the bytes they always had.

// maxExtrasBytes bounds the extras a non-streamed answer gathers: an engine
// is not trusted with the router's memory. Logprobs are most of it: with
// top_logprobs 20 a chat token's entry is about 1.2 KiB, so 16 MiB holds
// some 13,000 tokens' worth. A streamed answer holds none of it (each
// event is bounded by maxEventBytes).
const maxExtrasBytes = 16 << 20

// toolCallCost is what the router counts against maxExtrasBytes for each
// tool call it gathers beside the bytes of its deltas: its bookkeeping.
const toolCallCost = 128

// errExtrasBound is the error of an answer whose extras passed maxExtrasBytes.
var errExtrasBound = fmt.Errorf("it sent more than %d bytes of logprobs, reasoning and tool calls for one non-streamed answer (the router's bound)", maxExtrasBytes)

// extraJSON is a JSON value an engine chunk carried for the client alone,
// written as encoding/json writes a json.RawMessage: compact (an event's
// data may span lines; the value goes out on one) with <, >, &, U+2028
// and U+2029 escaped, as the router's own strings are. "" when the key was
// absent or null.
type extraJSON string

// UnmarshalJSON implements json.Unmarshaler. Invalid UTF-8, which can
// only be inside a string of valid JSON, is replaced by U+FFFD, so the
// client gets valid JSON text.
func (x *extraJSON) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		*x = ""
		return nil
	}
	if !utf8.Valid(data) {
		data = bytes.ToValidUTF8(data, []byte("\uFFFD"))
	}
	b, err := json.Marshal(json.RawMessage(data))
	if err != nil {
		return err
	}
	*x = extraJSON(b)
	return nil
}

// extras is the chunk's first choice if it carries anything beside text,
// token ids and a finish reason, else nil (every chunk of a request
// without logprobs, tools or a reasoning parser).
func (c *engineChunk) extras() *engineChoice {
	if len(c.Choices) == 0 {
		return nil
	}
	x := &c.Choices[0]
	if x.Logprobs == "" && x.Delta.Reasoning == "" && x.Delta.ReasoningContent == "" && x.Delta.ToolCalls == "" {
		return nil
	}
	return x
}

// carries reports whether x has extras the client's endpoint has room
// for: a completion has no delta.
func (e *emitter) carries(x *engineChoice) bool {
	return x.Logprobs != "" ||
		e.c.Kind == Chat && (x.Delta.Reasoning != "" || x.Delta.ReasoningContent != "" || x.Delta.ToolCalls != "")
}

// appendDelta appends the members of a chat delta with extras: content if
// the engine sent content (a delta of tool calls or reasoning alone has
// none, and the client gets none), then each extra as the engine sent it,
// in the order vLLM writes them.
func appendDelta(b []byte, text string, x *engineChoice) []byte {
	comma := false
	if x.Delta.Content != nil || text != "" {
		b = append(b, `"content":`...)
		b = appendJSONString(b, text)
		comma = true
	}
	for _, f := range [...]struct {
		key string
		v   extraJSON
	}{{`"reasoning":`, x.Delta.Reasoning}, {`"reasoning_content":`, x.Delta.ReasoningContent}, {`"tool_calls":`, x.Delta.ToolCalls}} {
		if f.v == "" {
			continue
		}
		if comma {
			b = append(b, ',')
		}
		b = append(b, f.key...)
		b = append(b, f.v...)
		comma = true
	}
	return b
}

// answerMessage is the message of a non-streamed chat answer. Content is
// null where vLLM answers null: tool calls and no text (unless the request
// forced a tool call: tool_choice "required" or a named function, where
// vLLM answers ""), or reasoning and no text. Where the router's answer
// differs from vLLM's own non-streamed one: vLLM also writes reasoning,
// refusal, annotations, audio and function_call as null when it has none,
// which the router leaves out (as it always has), and a tool call's id is
// the one the engine streamed (vLLM makes one if its parser gave none).
type answerMessage struct {
	Role             string           `json:"role,omitempty"`
	Content          *string          `json:"content"`
	ToolCalls        []answerToolCall `json:"tool_calls,omitempty"`
	Reasoning        *string          `json:"reasoning,omitempty"`
	ReasoningContent *string          `json:"reasoning_content,omitempty"`
}

// answerToolCall is one tool call of a non-streamed chat answer.
type answerToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// toolCallDelta is one element of a chat delta's tool_calls.
type toolCallDelta struct {
	Index    *int    `json:"index"`
	ID       *string `json:"id,omitempty"`
	Type     *string `json:"type,omitempty"`
	Function *struct {
		Name      *string `json:"name,omitempty"`
		Arguments *string `json:"arguments,omitempty"`
	} `json:"function,omitempty"`
}

// gatheredCall is a tool call being gathered from its deltas.
type gatheredCall struct {
	index          int
	id, typ, name  string
	args           strings.Builder
	hasID, hasType bool
	hasName        bool
}

// gatheredText is reasoning being gathered from its fragments.
type gatheredText struct {
	b    strings.Builder
	seen bool
}

// Logprobs lists, in the order vLLM writes them: a completion's
// (CompletionLogProbs) and a chat's (ChatCompletionLogProbs).
var (
	completionLogprobLists = []string{"text_offset", "token_logprobs", "tokens", "top_logprobs"}
	chatLogprobLists       = []string{"content"}
)

// answerExtras gathers the extras of a non-streamed answer from the
// streamed decode leg, as OpenAI's clients gather a stream: tool call
// deltas merged by index (the first delta of an index names its id, type
// and function; id, type and name are kept from the first delta that
// names them, and each delta's function.arguments is appended), reasoning
// fragments concatenated, and each logprobs list concatenated across the
// chunks. Members of a logprobs object other than its lists are left out.
type answerExtras struct {
	held             int // bytes taken in, bounded by maxExtrasBytes
	reasoning        gatheredText
	reasoningContent gatheredText
	calls            []*gatheredCall
	byIndex          map[int]*gatheredCall
	logprobs         bool     // a chunk carried logprobs
	lists            [][]byte // each logprobs list's elements, comma-separated
}

// add takes in the extras of one chunk of a kind answer.
func (a *answerExtras) add(kind Kind, x *engineChoice) error {
	a.held += len(x.Logprobs)
	if kind == Chat {
		a.held += len(x.Delta.Reasoning) + len(x.Delta.ReasoningContent) + len(x.Delta.ToolCalls)
	}
	if a.held > maxExtrasBytes {
		return errExtrasBound
	}
	if x.Logprobs != "" {
		if err := a.addLogprobs(kind, x.Logprobs); err != nil {
			return err
		}
	}
	if kind != Chat {
		return nil
	}
	for _, r := range []struct {
		key string
		v   extraJSON
		to  *gatheredText
	}{{"reasoning", x.Delta.Reasoning, &a.reasoning}, {"reasoning_content", x.Delta.ReasoningContent, &a.reasoningContent}} {
		if r.v == "" {
			continue
		}
		var s string
		if err := json.Unmarshal([]byte(r.v), &s); err != nil {
			return fmt.Errorf("its delta.%s is not a string: %.100s", r.key, r.v)
		}
		r.to.b.WriteString(s)
		r.to.seen = true
	}
	if x.Delta.ToolCalls != "" {
		return a.addToolCalls(x.Delta.ToolCalls)
	}
	return nil
}

func (a *answerExtras) addLogprobs(kind Kind, raw extraJSON) error {
	names := completionLogprobLists
	if kind == Chat {
		names = chatLogprobLists
	}
	var lp map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &lp); err != nil {
		return fmt.Errorf("its logprobs are not an object: %.100s", raw)
	}
	if a.lists == nil {
		a.lists = make([][]byte, len(names))
	}
	a.logprobs = true
	for i, name := range names {
		v, ok := lp[name]
		if !ok || isNull(v) {
			continue
		}
		// v is compact (raw is), so a list is [ elements ].
		if len(v) < 2 || v[0] != '[' {
			return fmt.Errorf("its logprobs.%s is not a list: %.100s", name, v)
		}
		if elems := v[1 : len(v)-1]; len(elems) > 0 {
			if len(a.lists[i]) > 0 {
				a.lists[i] = append(a.lists[i], ',')
			}
			a.lists[i] = append(a.lists[i], elems...)
		}
	}
	return nil
}

func (a *answerExtras) addToolCalls(raw extraJSON) error {
	var deltas []toolCallDelta
	if err := json.Unmarshal([]byte(raw), &deltas); err != nil {
		return fmt.Errorf("its delta.tool_calls are not a list of tool call deltas: %v", err)
	}
	for _, d := range deltas {
		if d.Index == nil {
			return errors.New("it sent a tool call delta without an index")
		}
		c := a.byIndex[*d.Index]
		if c == nil {
			if a.held += toolCallCost; a.held > maxExtrasBytes {
				return errExtrasBound
			}
			if a.byIndex == nil {
				a.byIndex = map[int]*gatheredCall{}
			}
			c = &gatheredCall{index: *d.Index}
			a.byIndex[*d.Index] = c
			a.calls = append(a.calls, c)
		}
		if d.ID != nil && !c.hasID {
			c.id, c.hasID = *d.ID, true
		}
		if d.Type != nil && !c.hasType {
			c.typ, c.hasType = *d.Type, true
		}
		if f := d.Function; f != nil {
			if f.Name != nil && !c.hasName {
				c.name, c.hasName = *f.Name, true
			}
			if f.Arguments != nil {
				c.args.WriteString(*f.Arguments)
			}
		}
	}
	return nil
}

// fill puts what was gathered into the answer's choice ch, whose message
// (a chat) holds the answer's text already.
func (a *answerExtras) fill(ch *outChoice, c *ClientRequest) {
	if a.logprobs {
		names := completionLogprobLists
		if c.Kind == Chat {
			names = chatLogprobLists
		}
		b := []byte{'{'}
		for i, name := range names {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(append(append(b, '"'), name...), `":[`...)
			b = append(append(b, a.lists[i]...), ']')
		}
		ch.Logprobs = append(b, '}')
	}
	m := ch.Message
	if m == nil {
		return
	}
	for _, r := range []struct {
		g  *gatheredText
		to **string
	}{{&a.reasoning, &m.Reasoning}, {&a.reasoningContent, &m.ReasoningContent}} {
		if r.g.seen {
			s := r.g.b.String()
			*r.to = &s
		}
	}
	slices.SortStableFunc(a.calls, func(x, y *gatheredCall) int { return x.index - y.index })
	for _, g := range a.calls {
		tc := answerToolCall{ID: g.id, Type: g.typ}
		if !g.hasType {
			tc.Type = "function"
		}
		tc.Function.Name, tc.Function.Arguments = g.name, g.args.String()
		m.ToolCalls = append(m.ToolCalls, tc)
	}
	if m.Content != nil && *m.Content == "" {
		if len(m.ToolCalls) > 0 && !forcedToolCall(c) || len(m.ToolCalls) == 0 && (a.reasoning.seen || a.reasoningContent.seen) {
			m.Content = nil
		}
	}
}

// forcedToolCall reports whether a chat forced a tool call: tool_choice
// "required" or a named function (an object).
func forcedToolCall(c *ClientRequest) bool {
	raw, ok := c.Body["tool_choice"]
	if !ok {
		return false
	}
	raw = bytes.TrimSpace(raw)
	return string(raw) == `"required"` || len(raw) > 0 && raw[0] == '{'
}

// gather takes in the extras of a chunk of a non-streamed answer; an
// engine whose extras the answer cannot hold fails the answer (failed).
func (e *emitter) gather(x *engineChoice) {
	if e.whole == nil {
		e.whole = &answerExtras{}
	}
	if err := e.whole.add(e.c.Kind, x); err != nil {
		e.failed = serverError(CodeEngineFailed, "decode engine %s: %v", e.decodeEngine(), err)
	}
}

// decodeEngine is the engine the answer streams from now ("" before one).
func (e *emitter) decodeEngine() string {
	if ds, ok := e.connex["decode_engines"].([]string); ok && len(ds) > 0 {
		return ds[len(ds)-1]
	}
	return ""
}
