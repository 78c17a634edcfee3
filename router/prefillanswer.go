package router

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/valyala/fastjson"
)

// prefillAnswer is what the router reads from a prefill engine's answer.
type prefillAnswer struct {
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	PromptTokenIDs   tokenIDs        `json:"prompt_token_ids"`
	Choices          []struct {
		PromptTokenIDs tokenIDs `json:"prompt_token_ids"`
	} `json:"choices"`
}

// parsePrefillAnswer reads a prefill engine's answer: with fastjson for
// the common answer (a valid UTF-8 object without \u escapes whose keys
// the router reads are each there once and exactly so), else with
// encoding/json, whose reading and errors it matches (FuzzPrefillAnswer).
// encoding/json walked the whole answer through reflection for three
// fields: the largest part of what the prefill leg cost the router.
func parsePrefillAnswer(data []byte) (*prefillAnswer, error) {
	p := jsonParsers.Get()
	ans, ok := fastPrefillAnswer(p, data)
	jsonParsers.Put(p)
	if ok {
		return ans, nil
	}
	ans = new(prefillAnswer)
	if err := json.Unmarshal(data, ans); err != nil {
		return nil, err
	}
	return ans, nil
}

func fastPrefillAnswer(p *fastjson.Parser, data []byte) (*prefillAnswer, bool) {
	// kv_transfer_params is written again from its parse: valid UTF-8 and
	// no \u escape keep that write JSON (fastjson quotes a string with
	// Go's strconv) and equal to what the engine sent.
	if !utf8.Valid(data) {
		return nil, false
	}
	v, ok := parseStrict(p, data)
	if !ok || v.Type() != fastjson.TypeObject || !plainKeys(v, "kv_transfer_params", "prompt_token_ids", "choices") {
		return nil, false
	}
	var err error
	ans := &prefillAnswer{}
	if kv := v.Get("kv_transfer_params"); kv != nil {
		ans.KVTransferParams = kv.MarshalTo(nil)
	}
	if ans.PromptTokenIDs, err = fastTokenIDs(v.Get("prompt_token_ids")); err != nil {
		return nil, false
	}
	cs := v.Get("choices")
	if cs == nil || cs.Type() == fastjson.TypeNull {
		return ans, true
	}
	arr, err := cs.Array()
	if err != nil {
		return nil, false
	}
	ans.Choices = make([]struct {
		PromptTokenIDs tokenIDs `json:"prompt_token_ids"`
	}, len(arr))
	for i, c := range arr {
		if c.Type() == fastjson.TypeNull {
			continue
		}
		if c.Type() != fastjson.TypeObject || !plainKeys(c, "prompt_token_ids") {
			return nil, false
		}
		if ans.Choices[i].PromptTokenIDs, err = fastTokenIDs(c.Get("prompt_token_ids")); err != nil {
			return nil, false
		}
	}
	return ans, true
}
