package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/valyala/fastjson"
)

// Kind is the OpenAI endpoint a client called.
type Kind int

// The endpoints the router serves.
const (
	Completions Kind = iota
	Chat
)

// Path is the endpoint's path on engines.
func (k Kind) Path() string {
	if k == Chat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
}

// defaultCompletionMaxTokens is OpenAI's (and vLLM's) max_tokens default for
// /v1/completions. The router makes it explicit so that a resume can ask
// for exactly the tokens still missing.
const defaultCompletionMaxTokens = 16

// ClientRequest is a client's request as the router needs it. Body holds
// the client's fields that passed ParseClient (known keys only, each
// exactly once, values re-encoded); the legs are built from it.
type ClientRequest struct {
	Kind  Kind
	Body  map[string]json.RawMessage
	Model string
	// Stream and IncludeUsage are what the client asked for; every decode
	// leg streams whatever the client asked.
	Stream       bool
	IncludeUsage bool
	// MaxTokens is the client's limit on generated tokens; 0 means none
	// (chat: the engine's model length bounds it).
	MaxTokens int
	// ReturnTokenIDs: the client asked for vLLM's token-id extension.
	ReturnTokenIDs bool
}

// Fields a resume (a /v1/completions request of token ids) cannot carry
// over from a chat request, or that the router sets itself.
// response_format stays: vLLM's /v1/completions reads it as its chat
// endpoint does (json_object, json_schema, structural_tag become the
// request's structured outputs), so the resumed leg's grammar is the first
// leg's, advanced over the generated tokens (connex_resume_generated).
// truncate_prompt_tokens would cut the resumed prompt (the prefill's ids,
// already truncated, then the generated ones); prompt_logprobs would make the
// engine compute the whole prompt again, and the router relays neither.
var resumeDrops = []string{
	"messages", "prompt", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n",
	"kv_transfer_params", "return_token_ids", "echo", "logprobs", "top_logprobs", "tools", "tool_choice",
	"parallel_tool_calls", "chat_template", "chat_template_kwargs", "add_generation_prompt",
	"continue_final_message", "documents", "min_tokens", "suffix", "best_of", "truncate_prompt_tokens",
	"prompt_logprobs",
}

// ParseClient validates a client's body for endpoint kind.
func ParseClient(kind Kind, data []byte) (*ClientRequest, *APIError) {
	c := &ClientRequest{Kind: kind}
	body, err := decodeObject(data)
	if err != nil {
		var ke *keyError
		if errors.As(err, &ke) {
			return nil, badRequest(ke.key, "%s", ke.msg)
		}
		return nil, badRequest("", "%v", err)
	}
	if ke := checkKeys(body); ke != nil {
		return nil, badRequest(ke.key, "%s", ke.msg)
	}
	c.Body = body
	if err := field(c.Body, "model", &c.Model); err != nil || c.Model == "" {
		return nil, badRequest("model", "model must be a non-empty string")
	}
	if err := field(c.Body, "stream", &c.Stream); err != nil {
		return nil, badRequest("stream", "stream must be a boolean")
	}
	if err := field(c.Body, "return_token_ids", &c.ReturnTokenIDs); err != nil {
		return nil, badRequest("return_token_ids", "return_token_ids must be a boolean")
	}
	if raw, ok := c.Body["stream_options"]; ok && !isNull(raw) {
		// Exact keys only: the legs carry the router's own stream_options.
		var so map[string]json.RawMessage
		if err := json.Unmarshal(raw, &so); err != nil || field(so, "include_usage", &c.IncludeUsage) != nil {
			return nil, badRequest("stream_options", "stream_options must be an object such as {\"include_usage\": true}")
		}
	}
	for _, key := range []string{"max_tokens", "max_completion_tokens"} {
		var n *int
		if err := field(c.Body, key, &n); err != nil {
			return nil, badRequest(key, "%s must be an integer", key)
		}
		if n != nil {
			if *n < 1 {
				return nil, badRequest(key, "%s must be at least 1, got %d", key, *n)
			}
			if c.MaxTokens == 0 || *n < c.MaxTokens {
				c.MaxTokens = *n
			}
		}
	}
	if e := checkSampling(c.Body, c.MaxTokens); e != nil {
		return nil, e
	}
	var n *int
	if err := field(c.Body, "n", &n); err != nil || (n != nil && *n != 1) {
		return nil, badRequest("n", "only n=1 is supported")
	}
	var echo bool
	if err := field(c.Body, "echo", &echo); err != nil || echo {
		return nil, badRequest("echo", "echo is not supported by the router")
	}
	switch kind {
	case Completions:
		raw, ok := c.Body["prompt"]
		if !ok {
			return nil, badRequest("prompt", "prompt is required")
		}
		var s string
		var ids tokenIDs
		if json.Unmarshal(raw, &s) != nil && (json.Unmarshal(raw, &ids) != nil || len(ids) == 0) {
			return nil, badRequest("prompt", "prompt must be a string or a non-empty array of token ids (batched prompts are not supported)")
		}
		if c.MaxTokens == 0 {
			c.MaxTokens = defaultCompletionMaxTokens
		}
	case Chat:
		var msgs []map[string]json.RawMessage
		if err := field(c.Body, "messages", &msgs); err != nil || len(msgs) == 0 {
			return nil, badRequest("messages", "messages must be a non-empty array of message objects")
		}
	}
	return c, nil
}

func errText(err error) string {
	if err == nil {
		return "null"
	}
	return err.Error()
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// field decodes body[key] into out if present and not null.
func field(body map[string]json.RawMessage, key string, out any) error {
	raw, ok := body[key]
	if !ok || isNull(raw) {
		return nil
	}
	return json.Unmarshal(raw, out)
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("router: encode %T: %v", v, err)) // only plain values are encoded
	}
	return b
}

// encode writes body as one JSON object, keys sorted as encoding/json
// sorts a map's. Each value is JSON already, checked where it was made
// (decodeObject re-encodes a client's, json.Unmarshal checked an engine's,
// mustJSON wrote the router's), so it is copied as it is: encoding/json
// would check and compact every value again, per leg.
func encode(body map[string]json.RawMessage) []byte {
	keys := slices.AppendSeq(make([]string, 0, 32), maps.Keys(body)) // on the stack for a usual body
	slices.Sort(keys)
	n := 2
	for _, k := range keys {
		n += len(k) + len(body[k]) + 4
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendKey(b, k)
		b = append(b, ':')
		b = append(b, body[k]...)
	}
	return append(b, '}')
}

// appendKey appends key as a JSON string: as it is when it is a plain
// identifier (every key a client may send, and the router's), else as
// encoding/json quotes it (an engine's kv_transfer_params may hold any).
func appendKey(b []byte, key string) []byte {
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return append(b, mustJSON(key)...)
		}
	}
	b = append(b, '"')
	b = append(b, key...)
	return append(b, '"')
}

// The values the router writes into every leg, encoded once.
var (
	rawOne           = json.RawMessage("1")
	rawTrue          = json.RawMessage("true")
	rawNull          = json.RawMessage("null")
	rawFalse         = json.RawMessage("false")
	rawIncludeUsage  = mustJSON(map[string]bool{"include_usage": true})
	rawPrefillParams = mustJSON(map[string]any{"do_remote_decode": true, "do_remote_prefill": false})
)

// PrefillBody is the prefill leg, as vLLM's P/D proxy sends it: the client's
// request with max_tokens 1, not streamed, and kv_transfer_params asking the
// engine to keep the KV for a remote decode. return_token_ids makes the
// engine report the prompt's token ids, which a resume needs.
func PrefillBody(c *ClientRequest) []byte {
	b := maps.Clone(c.Body)
	b["max_tokens"] = rawOne
	if _, ok := b["max_completion_tokens"]; ok {
		b["max_completion_tokens"] = rawOne
	}
	b["stream"] = rawFalse
	delete(b, "stream_options")
	delete(b, "min_tokens")
	b["return_token_ids"] = rawTrue
	b["kv_transfer_params"] = rawPrefillParams
	return encode(b)
}

// withRequestID returns the prefill's kv_transfer_params with the router's
// request id, and for a resume (generated ≥ 0) connex_resume and
// connex_resume_generated: how many of the resumed prompt's trailing tokens
// were generated (the engine advances the request's grammar over them).
// generated < 0 is the first decode leg.
func withRequestID(params json.RawMessage, requestID string, generated int) (json.RawMessage, error) {
	p, err := paramsObject(params)
	if err != nil {
		return nil, err
	}
	p["connex_request_id"] = appendKey(nil, requestID) // a JSON string, as a key is written
	delete(p, "connex_resume_generated")
	if generated >= 0 {
		p["connex_resume"] = json.RawMessage("true")
		if generated > 0 {
			p["connex_resume_generated"] = strconv.AppendInt(nil, int64(generated), 10)
		}
	} else {
		delete(p, "connex_resume")
	}
	return encode(p), nil
}

// paramsObject decodes a prefill's kv_transfer_params as encoding/json
// decodes them into a map of raw values: with fastjson when they are valid
// UTF-8 without \u escapes or a key twice (what a prefill engine sends),
// else with encoding/json (FuzzParamsObject holds the two equal).
func paramsObject(params json.RawMessage) (map[string]json.RawMessage, error) {
	if p, ok := fastParamsObject(params); ok {
		return p, nil
	}
	var p map[string]json.RawMessage
	if err := json.Unmarshal(params, &p); err != nil || p == nil {
		return nil, fmt.Errorf("kv_transfer_params of the prefill answer is not an object: %v", errText(err))
	}
	return p, nil
}

func fastParamsObject(data []byte) (map[string]json.RawMessage, bool) {
	if !utf8.Valid(data) {
		return nil, false
	}
	parser := jsonParsers.Get()
	defer jsonParsers.Put(parser)
	v, ok := parseStrict(parser, data)
	if !ok || v.Type() != fastjson.TypeObject {
		return nil, false
	}
	o, _ := v.Object()
	p := make(map[string]json.RawMessage, o.Len()+1)
	o.Visit(func(k []byte, v *fastjson.Value) { p[string(k)] = v.MarshalTo(nil) })
	return p, len(p) == o.Len() // else a key twice: encoding/json keeps the last
}

// DecodeBody is the first decode leg: the client's request with the
// prefill's kv_transfer_params, always streamed (a non-streaming client's
// answer is assembled by the router, so that it too survives a decode death).
func DecodeBody(c *ClientRequest, params json.RawMessage, requestID string) ([]byte, error) {
	p, err := withRequestID(params, requestID, -1)
	if err != nil {
		return nil, err
	}
	return decodeBody(c, p), nil
}

func decodeBody(c *ClientRequest, params json.RawMessage) []byte {
	b := maps.Clone(c.Body)
	b["stream"] = rawTrue
	b["stream_options"] = rawIncludeUsage
	b["return_token_ids"] = rawTrue
	b["kv_transfer_params"] = params
	if c.Kind == Completions {
		b["max_tokens"] = strconv.AppendInt(nil, int64(c.MaxTokens), 10)
	}
	return encode(b)
}

// ReplayBody is a decode leg that resumes a request by replay (replay.go):
// the first decode leg again (the client's request, the prefill's
// kv_transfer_params), with connex_resume, so the engine's connector takes
// the request over and loads the hold's KV. The engine generates the answer
// again from its first token, its grammar from its start.
func ReplayBody(c *ClientRequest, params json.RawMessage, requestID string) ([]byte, error) {
	p, err := withRequestID(params, requestID, 0)
	if err != nil {
		return nil, err
	}
	return decodeBody(c, p), nil
}

// ResumeBody is a resumed decode leg: a /v1/completions request whose prompt
// is the prompt's token ids followed by the tokens already generated, asking
// for the tokens still missing, with the same kv_transfer_params and
// connex_resume. The engine loads remote_num_tokens of KV and recomputes the
// rest. Sampling fields and structured outputs (structured_outputs,
// response_format) pass through, and connex_resume_generated tells the
// engine's connector how many generated tokens to advance the grammar over,
// so the resumed leg continues the constraint where the failed one stopped.
// What a completions leg cannot carry (tool calls, logprobs) or would answer
// differently is refused before a resume (resumeRefusal).
func ResumeBody(c *ClientRequest, promptIDs, generated []uint32, params json.RawMessage, requestID string) ([]byte, error) {
	if len(promptIDs) == 0 {
		return nil, fmt.Errorf("the prefill engine did not report the prompt's token ids (return_token_ids), so the request cannot resume")
	}
	p, err := withRequestID(params, requestID, len(generated))
	if err != nil {
		return nil, err
	}
	b := maps.Clone(c.Body)
	for _, k := range resumeDrops {
		delete(b, k)
	}
	all := append(append(make([]uint32, 0, len(promptIDs)+len(generated)), promptIDs...), generated...)
	b["prompt"] = mustJSON(all)
	if c.MaxTokens > 0 {
		b["max_tokens"] = mustJSON(c.MaxTokens - len(generated))
	} else {
		// A chat that names no max_tokens runs to the end of the context
		// (vLLM: max_model_len less the prompt); a completions leg without
		// one would stop 16 tokens on. null asks vLLM for the chat's rule.
		b["max_tokens"] = rawNull
	}
	var minTokens int
	if field(c.Body, "min_tokens", &minTokens) == nil && minTokens > len(generated) {
		b["min_tokens"] = mustJSON(minTokens - len(generated))
	}
	b["stream"] = rawTrue
	b["stream_options"] = rawIncludeUsage
	b["return_token_ids"] = rawTrue
	b["kv_transfer_params"] = p
	return encode(b), nil
}
