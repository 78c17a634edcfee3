package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

var prefillSeeds = []string{
	`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"x","logprobs":null,"finish_reason":"length","prompt_token_ids":[1,2,3]}],"usage":{"prompt_tokens":3},"kv_transfer_params":{"transfer_id":"t-1","remote_engine_id":"p1","remote_block_ids":[1,2],"remote_num_tokens":3,"do_remote_prefill":true,"x":1.50e3,"s":"a\"b\\c\/d é"}}`,
	`{"prompt_token_ids":[7,8],"kv_transfer_params":{"a":null}}`,
	`{"kv_transfer_params":null,"choices":null}`,
	`{"choices":[null,{"prompt_token_ids":null}],"kv_transfer_params":{}}`,
	`{"KV_Transfer_Params":{"a":1}}`,
	`{"kv_transfer_params":{"a":1},"kv_transfer_params":{"b":2}}`,
	`{"kv_transfer_params":{"a":"\u00e9"}}`,
	`{"prompt_token_ids":[-1]}`,
	`{"prompt_token_ids":"x"}`,
	`{"choices":{}}`,
	`{"choices":[1]}`,
	`{"choices":[{"Prompt_Token_IDs":[1]}]}`,
	`[1,2]`,
	`null`,
	`{"kv_transfer_params":{"a":1}`,
	"{\"kv_transfer_params\":{\"a\":\"\xff\"}}",
	` { "kv_transfer_params" : { "a" : [ 1 , 2 ] } } `,
}

func checkPrefillAnswer(t *testing.T, data []byte) {
	got, gerr := parsePrefillAnswer(data)
	want := new(prefillAnswer)
	werr := json.Unmarshal(data, want)
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("%q: parsePrefillAnswer error %v, encoding/json error %v", data, gerr, werr)
	}
	if werr != nil {
		return
	}
	if !reflect.DeepEqual(got.PromptTokenIDs, want.PromptTokenIDs) || !reflect.DeepEqual(got.Choices, want.Choices) {
		t.Fatalf("%q: token ids\nfast          %+v\nencoding/json %+v", data, got, want)
	}
	if (got.KVTransferParams == nil) != (want.KVTransferParams == nil) || !sameJSON(got.KVTransferParams, want.KVTransferParams) {
		t.Fatalf("%q: kv_transfer_params\nfast          %s\nencoding/json %s", data, got.KVTransferParams, want.KVTransferParams)
	}
}

// sameJSON reports whether a and b are the same JSON value (numbers as written).
func sameJSON(a, b []byte) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	decode := func(x []byte) (any, error) {
		d := json.NewDecoder(bytes.NewReader(x))
		d.UseNumber()
		var v any
		return v, d.Decode(&v)
	}
	va, ea := decode(a)
	vb, eb := decode(b)
	return ea == nil && eb == nil && reflect.DeepEqual(va, vb)
}

// TestPrefillAnswerIsEncodingJSONs: the fast reading of a prefill's answer
// gives what encoding/json gives.
func TestPrefillAnswerIsEncodingJSONs(t *testing.T) {
	for _, s := range prefillSeeds {
		checkPrefillAnswer(t, []byte(s))
	}
	p := jsonParsers.Get()
	defer jsonParsers.Put(p)
	if _, ok := fastPrefillAnswer(p, []byte(prefillSeeds[0])); !ok {
		t.Fatal("vLLM's usual prefill answer is not read on the fast path")
	}
}

func FuzzPrefillAnswer(f *testing.F) {
	for _, s := range prefillSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkPrefillAnswer(t, data) })
}

var paramsSeeds = []string{
	`{"transfer_id":"t-1","remote_block_ids":[1,2],"remote_num_tokens":3,"do_remote_prefill":true,"x":1.50e3,"s":"a\"b\\c\/d é"}`,
	`{}`, `null`, `[]`, `{"a":1,"a":2}`, `{"a":"\u00e9"}`, "{\"a\":\"\xff\"}", ` { "a" : [ 1 , { "b" : null } ] } `, `{"a":1`,
	`{"connex_resume":false,"connex_request_id":"old"}`,
}

// checkParamsObject: kv_transfer_params decode as encoding/json decodes
// them into a map of raw values.
func checkParamsObject(t *testing.T, data []byte) {
	got, gerr := paramsObject(data)
	var want map[string]json.RawMessage
	werr := json.Unmarshal(data, &want)
	if werr == nil && want == nil {
		werr = errors.New("null")
	}
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("%q: paramsObject error %v, encoding/json %v", data, gerr, werr)
	}
	if len(got) != len(want) {
		t.Fatalf("%q: paramsObject %v, encoding/json %v", data, got, want)
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || !sameJSON(g, w) {
			t.Fatalf("%q: key %q: paramsObject %s, encoding/json %s", data, k, g, w)
		}
	}
}

func TestParamsObjectIsEncodingJSONs(t *testing.T) {
	for _, s := range paramsSeeds {
		checkParamsObject(t, []byte(s))
	}
	b, err := withRequestID([]byte(paramsSeeds[9]), "cmpl-1", 0)
	if err != nil || string(b) != `{"connex_request_id":"cmpl-1","connex_resume":true}` {
		t.Fatalf("withRequestID: %s %v", b, err)
	}
	// A resume after 7 tokens says so; an engine's own connex_resume_generated
	// never survives (the router alone counts what was generated).
	b, err = withRequestID([]byte(`{"connex_resume_generated":99,"connex_resume":true}`), "cmpl-1", 7)
	if err != nil || string(b) != `{"connex_request_id":"cmpl-1","connex_resume":true,"connex_resume_generated":7}` {
		t.Fatalf("withRequestID of a resume: %s %v", b, err)
	}
	b, err = withRequestID([]byte(`{"connex_resume_generated":99,"connex_resume":true}`), "cmpl-1", -1)
	if err != nil || string(b) != `{"connex_request_id":"cmpl-1"}` {
		t.Fatalf("withRequestID of a first leg: %s %v", b, err)
	}
}

func FuzzParamsObject(f *testing.F) {
	for _, s := range paramsSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkParamsObject(t, data) })
}
