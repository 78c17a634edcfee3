package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// A client's body reaches engines only through the fields below: the router
// decodes it strictly (one JSON object, no key twice), refuses the keys it
// sets itself and every key that differs from a known one only by case or
// Unicode folding (engines written in Go fold struct keys: "\u212Av_transfer_params",
// with a Kelvin sign, is kv_transfer_params to encoding/json), refuses keys
// it does not know, and builds each leg's body from the parsed fields.

// internalKeys are the request fields only the router writes: a client that
// sends one is refused, so that no client steers which hold an engine pulls
// or which request it takes over.
var internalKeys = []string{"kv_transfer_params", "request_id"}

// clientKeys are the request fields a client may send, OpenAI's and vLLM's
// sampling extensions (vLLM's extra request parameters). Anything else is
// refused with 400, as OpenAI refuses an unrecognized argument.
var clientKeys = map[string]bool{
	// both endpoints
	"model": true, "stream": true, "stream_options": true, "max_tokens": true, "n": true,
	"temperature": true, "top_p": true, "frequency_penalty": true, "presence_penalty": true, "stop": true,
	"seed": true, "logit_bias": true, "logprobs": true, "user": true, "echo": true,
	// completions
	"prompt": true, "suffix": true, "best_of": true,
	// chat
	"messages": true, "max_completion_tokens": true, "top_logprobs": true, "tools": true, "tool_choice": true,
	"parallel_tool_calls": true, "response_format": true, "metadata": true, "store": true, "service_tier": true,
	"reasoning_effort": true, "chat_template": true, "chat_template_kwargs": true, "add_generation_prompt": true,
	"continue_final_message": true, "documents": true, "add_special_tokens": true, "mm_processor_kwargs": true,
	// vLLM's sampling extensions
	"top_k": true, "min_p": true, "repetition_penalty": true, "length_penalty": true, "stop_token_ids": true,
	"include_stop_str_in_output": true, "ignore_eos": true, "min_tokens": true, "skip_special_tokens": true,
	"spaces_between_special_tokens": true, "truncate_prompt_tokens": true, "prompt_logprobs": true,
	"allowed_token_ids": true, "bad_words": true, "return_token_ids": true, "priority": true, "cache_salt": true,
	"structured_outputs": true, "guided_json": true, "guided_regex": true, "guided_choice": true,
	"guided_grammar": true, "guided_decoding_backend": true, "guided_whitespace_pattern": true,
}

// maxKeys bounds the keys of a client body (every legitimate body has far fewer).
const maxKeys = 128

// decodeObject reads data as exactly one JSON object and returns its members
// with each value re-encoded from its parsed form. A key present twice is an
// error (parsers disagree on which copy wins), as is anything after the object.
func decodeObject(data []byte) (map[string]json.RawMessage, error) {
	if out, ok := decodeObjectFast(data); ok {
		return out, nil
	}
	return decodeObjectTokens(data)
}

// decodeObjectTokens is decodeObject token by token: the reference, and
// what reports every error.
func decodeObjectTokens(data []byte) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("the body is not a JSON object: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("the body is not a JSON object (it starts with %v)", tok)
	}
	out := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("the body is not a JSON object: %w", err)
		}
		key, _ := tok.(string) // inside an object the decoder yields only string keys
		if _, dup := out[key]; dup {
			return nil, &keyError{key: key, msg: fmt.Sprintf("the key %q appears more than once", key)}
		}
		if len(out) == maxKeys {
			return nil, fmt.Errorf("the body has more than %d keys", maxKeys)
		}
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("the value of %q is not JSON: %w", key, err)
		}
		// Re-encoding drops what a parser could read two ways (a repeated
		// key inside a nested object keeps its last copy, as Python's does).
		out[key] = mustJSON(v)
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, fmt.Errorf("the body is not a JSON object: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("the body has data after its JSON object")
	}
	return out, nil
}

// keyError is a refused key: its message names it, Param carries it.
type keyError struct {
	key, msg string
}

func (e *keyError) Error() string { return e.msg }

// checkKeys refuses internal keys, keys that fold to a known key without
// being it, and unknown keys.
func checkKeys(body map[string]json.RawMessage) *keyError {
	plain := true
	for key := range body {
		plain = plain && clientKeys[key]
	}
	if plain {
		return nil // every key is a client's: none is internal, none folds
	}
	for _, key := range slices.Sorted(maps.Keys(body)) { // the first refused, by name
		for _, k := range internalKeys {
			if key == k {
				return &keyError{key: key, msg: fmt.Sprintf("%s is set by the router, not by clients", k)}
			}
			if strings.EqualFold(key, k) {
				return &keyError{key: key, msg: fmt.Sprintf("the key %q folds to %s, which is set by the router, not by clients (keys are case-sensitive)", key, k)}
			}
		}
		if clientKeys[key] {
			continue
		}
		for k := range clientKeys {
			if strings.EqualFold(key, k) {
				return &keyError{key: key, msg: fmt.Sprintf("unknown parameter %q: keys are case-sensitive (did you mean %q?)", key, k)}
			}
		}
		return &keyError{key: key, msg: fmt.Sprintf("unrecognized request argument %q", key)}
	}
	return nil
}
