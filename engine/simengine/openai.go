package simengine

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/encoding/protojson"
)

// DefaultMaxTokens is the completion length when a request names none
// (OpenAI's legacy completions default; vLLM's chats run to the end of the
// context instead, which the simulator gives for "max_tokens": null).
const DefaultMaxTokens = 16

// toContextEnd is genRequest.maxTokens for "max_tokens": null until
// Server.check knows the prompt's length.
const toContextEnd = -1

// httpError is an OpenAI-shaped error with its HTTP status.
type httpError struct {
	Status  int
	Type    string
	Code    string
	Param   string
	Message string
}

func (e *httpError) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

func badRequest(code, param, format string, a ...any) *httpError {
	return &httpError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code, Param: param, Message: fmt.Sprintf(format, a...)}
}

func serverError(status int, code, format string, a ...any) *httpError {
	return &httpError{Status: status, Type: "server_error", Code: code, Message: fmt.Sprintf(format, a...)}
}

// errorBody is the JSON of an OpenAI error.
func (e *httpError) body() []byte {
	var param any
	if e.Param != "" {
		param = e.Param
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": e.Message, "type": e.Type, "param": param, "code": e.Code}})
	return b
}

// wireRequest is the subset of an OpenAI completions / chat request the
// simulator honours; other fields are ignored, as vLLM ignores sampling
// fields it does not use.
type wireRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N                *int            `json:"n"`
	ReturnTokenIDs   bool            `json:"return_token_ids"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`

	// maxTokensNull: "max_tokens": null, which vLLM reads as "to the end
	// of the context" (a chat's default; what a resumed chat leg asks).
	maxTokensNull bool
}

// wireKeys are wireRequest's keys. The body is matched against them
// exactly: encoding/json matches struct keys case-insensitively with
// Unicode folding ("\u212Av_transfer_params", with a Kelvin sign, would
// fill KVTransferParams), so a key that folds to one of these without being
// it is refused, as is a key given twice; other keys are ignored, as vLLM
// ignores fields it does not use.
var wireKeys = []string{"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options",
	"n", "return_token_ids", "kv_transfer_params"}

// decodeWire decodes body into a wireRequest by exact keys.
func decodeWire(body []byte) (*wireRequest, *httpError) {
	obj, herr := strictObject(body, "")
	if herr != nil {
		return nil, herr
	}
	known := map[string]json.RawMessage{}
	for key, raw := range obj {
		for _, k := range wireKeys {
			switch {
			case key == k:
				known[k] = raw
			case strings.EqualFold(key, k):
				return nil, badRequest("invalid_value", key, "field %q is not %q: keys are case-sensitive", key, k)
			}
		}
	}
	if raw, ok := known["stream_options"]; ok {
		so, herr := strictObject(raw, "stream_options")
		if herr != nil && !isNullJSON(raw) {
			return nil, herr
		}
		for key := range so {
			if key != "include_usage" && strings.EqualFold(key, "include_usage") {
				return nil, badRequest("invalid_value", "stream_options", "stream_options: field %q is not \"include_usage\": keys are case-sensitive", key)
			}
		}
	}
	// Every key left is exactly a wireRequest key, present once: the
	// struct decode below can no longer fold or pick between copies.
	w := new(wireRequest)
	if err := json.Unmarshal(mustJSON(known), w); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, badRequest("invalid_type", te.Field, "field %q: expected %s, got a JSON %s", te.Field, te.Type, te.Value)
		}
		return nil, badRequest("invalid_json", "", "request body is not valid JSON: %v", err)
	}
	if raw, ok := known["max_tokens"]; ok && isNullJSON(raw) {
		w.maxTokensNull = true
	}
	return w, nil
}

func isNullJSON(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// strictObject reads data as one JSON object whose keys appear once each.
// what names it in errors ("" for the body).
func strictObject(data []byte, what string) (map[string]json.RawMessage, *httpError) {
	name := what
	if name == "" {
		name = "request body"
	}
	bad := func(format string, a ...any) *httpError {
		return badRequest("invalid_json", what, "%s: %s", name, fmt.Sprintf(format, a...))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, bad("not valid JSON: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, bad("not a JSON object")
	}
	out := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, bad("not valid JSON: %v", err)
		}
		key, _ := tok.(string)
		if _, dup := out[key]; dup {
			return nil, badRequest("invalid_value", key, "%s: the key %q appears more than once", name, key)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, bad("not valid JSON: %v", err)
		}
		out[key] = raw
	}
	if _, err := dec.Token(); err != nil {
		return nil, bad("not valid JSON: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, bad("data after the JSON object")
	}
	return out, nil
}

// genRequest is a validated request.
type genRequest struct {
	chat         bool
	model        string
	tokens       []uint32 // the prompt as token ids (for a resume: prompt + k generated)
	maxTokens    int
	stream       bool
	includeUsage bool
	tokenIDs     bool                       // return_token_ids
	params       *messages.KVTransferParams // nil: plain local serving
}

// parseRequest decodes and validates a request body. model is the served
// model name.
func parseRequest(body []byte, chat bool, model string) (*genRequest, *httpError) {
	w, herr := decodeWire(body)
	if herr != nil {
		return nil, herr
	}
	if w.Model != "" && w.Model != model {
		return nil, &httpError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
			Message: fmt.Sprintf("The model `%s` does not exist. This engine serves %q.", w.Model, model)}
	}
	g := &genRequest{chat: chat, model: model, stream: w.Stream, tokenIDs: w.ReturnTokenIDs, maxTokens: DefaultMaxTokens}
	if w.StreamOptions != nil {
		if !w.Stream {
			return nil, badRequest("invalid_value", "stream_options", "stream_options is only allowed with stream: true")
		}
		g.includeUsage = w.StreamOptions.IncludeUsage
	}
	if w.N != nil && *w.N != 1 {
		return nil, badRequest("invalid_value", "n", "n=%d: this engine returns one choice (n must be 1)", *w.N)
	}
	switch {
	case w.MaxCompletionTokens != nil:
		g.maxTokens = *w.MaxCompletionTokens
		if g.maxTokens < 1 {
			return nil, badRequest("invalid_value", "max_completion_tokens", "max_completion_tokens=%d: must be at least 1", g.maxTokens)
		}
	case w.MaxTokens != nil:
		g.maxTokens = *w.MaxTokens
		if g.maxTokens < 1 {
			return nil, badRequest("invalid_value", "max_tokens", "max_tokens=%d: must be at least 1", g.maxTokens)
		}
	case w.maxTokensNull:
		g.maxTokens = toContextEnd // Server.check sets it from the prompt
	}
	if chat {
		g.tokens, herr = chatTokens(w.Messages)
	} else {
		g.tokens, herr = promptTokens(w.Prompt)
	}
	if herr != nil {
		return nil, herr
	}
	if p := bytes.TrimSpace(w.KVTransferParams); len(p) > 0 && !bytes.Equal(p, []byte("null")) {
		var kp messages.KVTransferParams
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(p, &kp); err != nil {
			return nil, badRequest("invalid_value", "kv_transfer_params", "kv_transfer_params: %v", err)
		}
		if kp.DoRemotePrefill && kp.DoRemoteDecode {
			return nil, badRequest("invalid_value", "kv_transfer_params", "kv_transfer_params: do_remote_prefill and do_remote_decode are both true")
		}
		if kp.DoRemotePrefill || kp.DoRemoteDecode {
			g.params = &kp
		}
	}
	return g, nil
}

func promptTokens(raw json.RawMessage) ([]uint32, *httpError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("invalid_value", "prompt", "prompt is required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if s == "" {
			return nil, badRequest("invalid_value", "prompt", "prompt is empty")
		}
		return Encode(s), nil
	}
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err == nil {
		return checkIDs(ids)
	}
	// A batch of one: ["text"] or [[ids]].
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		if len(strs) != 1 {
			return nil, badRequest("invalid_value", "prompt", "a batch of %d prompts: this engine takes one prompt per request", len(strs))
		}
		return promptTokens(json.RawMessage(mustJSON(strs[0])))
	}
	var batch [][]int64
	if err := json.Unmarshal(raw, &batch); err == nil {
		if len(batch) != 1 {
			return nil, badRequest("invalid_value", "prompt", "a batch of %d prompts: this engine takes one prompt per request", len(batch))
		}
		return checkIDs(batch[0])
	}
	return nil, badRequest("invalid_type", "prompt", "prompt must be a string or an array of token ids")
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func checkIDs(ids []int64) ([]uint32, *httpError) {
	if len(ids) == 0 {
		return nil, badRequest("invalid_value", "prompt", "prompt is empty")
	}
	out := make([]uint32, len(ids))
	for i, id := range ids {
		if id < 0 || id > int64(MaxTokenID()) {
			return nil, badRequest("invalid_value", "prompt", "prompt token id %d at index %d is outside the vocabulary 0..%d", id, i, MaxTokenID())
		}
		out[i] = uint32(id)
	}
	return out, nil
}

func chatTokens(raw json.RawMessage) ([]uint32, *httpError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("invalid_value", "messages", "messages is required")
	}
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, badRequest("invalid_type", "messages", "messages must be an array of {role, content} objects: %v", err)
	}
	if len(msgs) == 0 {
		return nil, badRequest("invalid_value", "messages", "messages is empty")
	}
	out := make([]Message, 0, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, badRequest("invalid_value", fmt.Sprintf("messages[%d].role", i), "messages[%d] has no role", i)
		}
		text, herr := contentText(m.Content, i)
		if herr != nil {
			return nil, herr
		}
		out = append(out, Message{Role: m.Role, Content: text})
	}
	return Encode(RenderChat(out)), nil
}

// contentText accepts a string, null, or an array of {"type":"text","text"} parts.
func contentText(raw json.RawMessage, i int) (string, *httpError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badRequest("invalid_type", fmt.Sprintf("messages[%d].content", i), "messages[%d].content must be a string or an array of text parts", i)
	}
	var b bytes.Buffer
	for _, p := range parts {
		if p.Type != "text" {
			return "", badRequest("invalid_value", fmt.Sprintf("messages[%d].content", i), "content part type %q: only text is supported", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// paramsJSON renders kv_transfer_params as vLLM carries them: protojson
// with proto (snake_case) names, every field present.
func paramsJSON(p *messages.KVTransferParams) json.RawMessage {
	b, err := (protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}).Marshal(p)
	if err != nil {
		return nil
	}
	return b
}
