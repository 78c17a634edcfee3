package router

import (
	"encoding/json"
	"fmt"
	"strings"
)

// A replay is the resume of a request whose answer only the engine's whole
// generation gives: vLLM's tool parser and reasoning parser read the
// generated text from its first token, logprobs are the endpoint's for
// every token, and a seeded sampler, output penalties and bad words count
// what the request generated. A prefix resume (a completion of the prompt
// and the generated tokens) runs none of it. A replay sends the client's
// request again, as the first decode leg was (the same endpoint, the same
// fields, the hold's KV: still no second prefill), and the resumed engine
// generates the answer again from its first token; the router leaves out
// what the client already has and relays the rest. It costs one decode
// step per token already generated, where a prefix resume costs one
// forward pass over them, so the router replays only what a prefix resume
// would answer differently (resumeRefusal), and only a request that draws
// the same tokens again (replayable): greedy, or seeded.
//
// The filter compares as it skips. Token ids are compared position by
// position (a chunk's logprobs are its ids', so those of the ids left out
// are cut with them); text, reasoning and each tool call's arguments as
// strings, since a parser may hold text back and send it later: what the
// replay sends must extend what the client has. Anything else — an id, a
// byte, a tool call's name that differs — is a replay that drew other
// tokens, and the answer ends with resume_refused (diverged): never a
// different answer.

// replayable reports whether a request draws the same tokens when it is
// generated again: greedy (temperature 0 or top_k 1) or seeded.
func replayable(c *ClientRequest) bool {
	b := c.Body
	var temp *float64
	if field(b, "temperature", &temp) == nil && temp != nil && *temp == 0 {
		return true
	}
	var topK *int
	if field(b, "top_k", &topK) == nil && topK != nil && *topK == 1 {
		return true
	}
	raw, ok := b["seed"]
	return ok && !isNull(raw)
}

// sentExtras is what a chat's client has of the answer beside its text and
// token ids: reasoning and tool calls, as the replay filter compares them.
// The emitter keeps it from the first chunk with any (a request without
// them pays nothing).
type sentExtras struct {
	reasoning, reasoningContent strings.Builder
	calls                       map[int]*sentCall
}

// sentCall is one tool call the client has: whether its header (id, type,
// function name) went out, its name, and its arguments so far.
type sentCall struct {
	header bool
	name   string
	args   strings.Builder
}

// replayCursor is how far a replayed leg has come: ids and bytes of each
// string it sent, whether or not the client had them already.
type replayCursor struct {
	ids                         int
	text                        int
	reasoning, reasoningContent int
	args                        map[int]int
}

// errDiverged is the replay filter's error: the replayed leg generated
// other than what the client has.
type errDiverged struct{ what string }

func (e *errDiverged) Error() string {
	return "the resumed engine generated it again and drew other " + e.what + " than the client has"
}

// replayed reports whether a chunk of n ids holds only ids the client has
// (the replay is still catching up).
func (e *emitter) replayed(n int) bool {
	return e.replay != nil && n > 0 && e.replay.ids+n <= len(e.ids)
}

// startReplay makes the next leg a replay.
func (e *emitter) startReplay() {
	e.replay = &replayCursor{}
	e.skipIDs = 0
}

// filterReplay leaves out of a replayed chunk what the client has, and
// checks it against what the client has. x is the chunk's extras (nil:
// none); what it returns is a copy (nil when nothing is left).
func (e *emitter) filterReplay(text string, ids []uint32, x *engineChoice) (string, []uint32, *engineChoice, error) {
	r := e.replay
	// Ids, position by position.
	skip := min(max(len(e.ids)-r.ids, 0), len(ids))
	for i := range skip {
		if ids[i] != e.ids[r.ids+i] {
			return "", nil, nil, &errDiverged{what: fmt.Sprintf("tokens (token %d: id %d, the client has %d)", r.ids+i, ids[i], e.ids[r.ids+i])}
		}
	}
	r.ids += len(ids)
	all := len(ids)
	ids = ids[skip:]
	text, err := replayString(text, e.text.String(), &r.text, "text")
	if err != nil {
		return "", nil, nil, err
	}
	if x == nil {
		return text, ids, nil, nil
	}
	y := *x
	if skip > 0 && y.Logprobs != "" {
		if y.Logprobs, err = trimLogprobs(e.c.Kind, y.Logprobs, skip, all); err != nil {
			return "", nil, nil, err
		}
	}
	if e.c.Kind == Chat {
		s := e.sentX()
		if y.Delta.Reasoning, err = replayJSONString(y.Delta.Reasoning, s.reasoning.String(), &r.reasoning, "reasoning"); err != nil {
			return "", nil, nil, err
		}
		if y.Delta.ReasoningContent, err = replayJSONString(y.Delta.ReasoningContent, s.reasoningContent.String(), &r.reasoningContent, "reasoning"); err != nil {
			return "", nil, nil, err
		}
		if y.Delta.ToolCalls != "" {
			if y.Delta.ToolCalls, err = e.replayToolCalls(y.Delta.ToolCalls); err != nil {
				return "", nil, nil, err
			}
		}
	}
	if y.Logprobs == "" && y.Delta.Reasoning == "" && y.Delta.ReasoningContent == "" && y.Delta.ToolCalls == "" {
		return text, ids, nil, nil
	}
	return text, ids, &y, nil
}

// replayString is the part of delta past what the client has (sent), with
// at the bytes of the replayed string before delta; the part the client
// has must be sent's.
func replayString(delta, sent string, at *int, what string) (string, error) {
	n := min(max(len(sent)-*at, 0), len(delta))
	if n > 0 && delta[:n] != sent[*at:*at+n] {
		return "", &errDiverged{what: fmt.Sprintf("%s (at byte %d)", what, *at)}
	}
	*at += len(delta)
	return delta[n:], nil
}

// replayJSONString is replayString for a JSON string as an engine sent it
// ("" for none).
func replayJSONString(raw extraJSON, sent string, at *int, what string) (extraJSON, error) {
	if raw == "" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		return "", fmt.Errorf("its delta.%s is not a string: %.100s", what, raw)
	}
	rest, err := replayString(s, sent, at, what)
	if err != nil || rest == "" {
		return "", err
	}
	if rest == s {
		return raw, nil
	}
	return extraJSON(mustJSON(rest)), nil
}

// replayToolCalls leaves out of a replayed chunk's tool call deltas what
// the client has: the header of a call it has, the arguments it has.
func (e *emitter) replayToolCalls(raw extraJSON) (extraJSON, error) {
	var deltas []toolCallDelta
	if err := json.Unmarshal([]byte(raw), &deltas); err != nil {
		return "", fmt.Errorf("its delta.tool_calls are not a list of tool call deltas: %v", err)
	}
	s, r := e.sentX(), e.replay
	if r.args == nil {
		r.args = map[int]int{}
	}
	out := deltas[:0]
	for _, d := range deltas {
		if d.Index == nil {
			return "", fmt.Errorf("it sent a tool call delta without an index")
		}
		i := *d.Index
		if c := s.calls[i]; c != nil && c.header {
			if d.Function != nil && d.Function.Name != nil && *d.Function.Name != "" && *d.Function.Name != c.name {
				return "", &errDiverged{what: fmt.Sprintf("a tool call (%d: %q, the client has %q)", i, *d.Function.Name, c.name)}
			}
			d.ID, d.Type = nil, nil
			if d.Function != nil {
				d.Function.Name = nil
			}
		}
		if d.Function != nil && d.Function.Arguments != nil {
			var sent string
			if c := s.calls[i]; c != nil {
				sent = c.args.String()
			}
			at := r.args[i]
			rest, err := replayString(*d.Function.Arguments, sent, &at, fmt.Sprintf("tool call %d's arguments", i))
			if err != nil {
				return "", err
			}
			r.args[i] = at
			if rest == "" {
				d.Function.Arguments = nil
			} else {
				d.Function.Arguments = &rest
			}
		}
		if d.ID == nil && d.Type == nil && (d.Function == nil || d.Function.Name == nil && d.Function.Arguments == nil) {
			continue // the client has all of it
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return "", nil
	}
	return extraJSON(mustJSON(out)), nil
}

// trimLogprobs cuts the first skip of a chunk's n tokens' logprobs out of
// raw (every list of a completion's, a chat's content). A chunk whose
// lists are not one entry per token cannot be cut: the replay ends.
func trimLogprobs(kind Kind, raw extraJSON, skip, n int) (extraJSON, error) {
	if skip >= n {
		return "", nil
	}
	names := completionLogprobLists
	if kind == Chat {
		names = chatLogprobLists
	}
	var lp map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &lp); err != nil {
		return "", fmt.Errorf("its logprobs are not an object: %.100s", raw)
	}
	for _, name := range names {
		v, ok := lp[name]
		if !ok || isNull(v) {
			continue
		}
		var list []json.RawMessage
		if err := json.Unmarshal(v, &list); err != nil {
			return "", fmt.Errorf("its logprobs.%s is not a list: %.100s", name, v)
		}
		if len(list) != n {
			return "", &errDiverged{what: fmt.Sprintf("logprobs (%d for a chunk of %d tokens, which a replay cannot split)", len(list), n)}
		}
		lp[name] = mustJSON(list[skip:])
	}
	return extraJSON(encode(lp)), nil
}

// sentX is the client's reasoning and tool calls so far.
func (e *emitter) sentX() *sentExtras {
	if e.sent == nil {
		e.sent = &sentExtras{}
	}
	return e.sent
}

// keep records the reasoning and tool calls of a chunk the client gets.
func (s *sentExtras) keep(x *engineChoice) error {
	for _, r := range []struct {
		v  extraJSON
		to *strings.Builder
	}{{x.Delta.Reasoning, &s.reasoning}, {x.Delta.ReasoningContent, &s.reasoningContent}} {
		if r.v == "" {
			continue
		}
		var t string
		if err := json.Unmarshal([]byte(r.v), &t); err != nil {
			return fmt.Errorf("its delta's reasoning is not a string: %.100s", r.v)
		}
		r.to.WriteString(t)
	}
	if x.Delta.ToolCalls == "" {
		return nil
	}
	var deltas []toolCallDelta
	if err := json.Unmarshal([]byte(x.Delta.ToolCalls), &deltas); err != nil {
		return fmt.Errorf("its delta.tool_calls are not a list of tool call deltas: %v", err)
	}
	for _, d := range deltas {
		if d.Index == nil {
			return fmt.Errorf("it sent a tool call delta without an index")
		}
		if s.calls == nil {
			s.calls = map[int]*sentCall{}
		}
		c := s.calls[*d.Index]
		if c == nil {
			c = &sentCall{}
			s.calls[*d.Index] = c
		}
		if d.ID != nil || d.Type != nil || d.Function != nil && d.Function.Name != nil {
			c.header = true
		}
		if d.Function != nil && d.Function.Name != nil && *d.Function.Name != "" && c.name == "" {
			c.name = *d.Function.Name
		}
		if d.Function != nil && d.Function.Arguments != nil {
			c.args.WriteString(*d.Function.Arguments)
		}
	}
	return nil
}
