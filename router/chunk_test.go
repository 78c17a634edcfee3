package router

import (
	"encoding/json"
	"reflect"
	"testing"
)

var chunkSeeds = []string{
	`{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" t3","logprobs":null,"finish_reason":null,"token_ids":[1003]}]}`,
	`{"choices":[{"index":0,"delta":{"role":"assistant","content":"h\u00e9\n"},"finish_reason":"stop","token_ids":[1,2,4294967295]}],"prompt_token_ids":[1,2,3]}`,
	`{"choices":[{"delta":{"content":null},"text":null,"finish_reason":null,"token_ids":null}]}`,
	`{"choices":[],"usage":{"prompt_tokens":3}}`,
	`{"choices":null}`, `null`, `{}`, `[]`, `"x"`, `{"choices":{}}`, `{"choices":[1]}`, `{"choices":[null,{"text":"b"}]}`,
	`{"choices":[{"token_ids":[4294967296]}]}`, `{"choices":[{"token_ids":[-1]}]}`, `{"choices":[{"token_ids":[1.5]}]}`,
	`{"choices":[{"token_ids":[1e3]}]}`, `{"choices":[{"text":5}]}`, `{"choices":[{"delta":"x"}]}`,
	`{"choices":[{"text":"\ud800"}]}`, `{"choices":[{"text":"bad \xff"}]}`, "{\"choices\":[{\"text\":\"bad \xff\"}]}", "{\"choices\":[{\"text\":\"ctl \x01\"}]}",
	`{"choices":[{"text":"a\"b\\c\/\n\t"}]}`, `{"choices":[{"text":"\\u0041"}]}`, `{"choices":[{"token_ids":[01]}]}`, `{"choices":[{"token_ids":[1.]}]}`, `{"choices":[{"finish_reason":3}]}`,
	`{"Choices":[{"text":"a"}]}`, `{"choices":[{"TEXT":"a"}]}`, `{"choices":[{"text":"a","text":"b"}]}`,
	`{"choices":[{"text":"a"}],"choices":[{"text":"b"}]}`, `{"choices":[{"delta":{"Content":"a"}}]}`,
	`{"error":{"message":"boom","code":"x"}}`, `{"ERROR":{"message":"boom"}}`, `{"connex":{"kv_load":"pulled"},"choices":[]}`,
	`{"object":"error","message":"boom","type":"InternalServerError","code":500}`, `{"OBJECT":"error","message":"boom"}`,
	`{"object":"text_completion","choices":[]}`, `{"object":1,"choices":[]}`, `{"object":"error","object":"x"}`,
	`{"choices":[{"text":"a"}]} trailing`, `{"choices":[{"text":"a"}]`, ``,
	`{"created":NaN,"choices":[]}`, `{"created":Inf,"choices":[]}`, `{"created":-0.5e+3,"choices":[]}`, `{"created":+1,"choices":[]}`,
	`{"created":.5,"choices":[]}`, `{"created":-,"choices":[]}`, `{"created":1e,"choices":[]}`, `{"created":1E+5,"choices":[{"index":-0}]}`,
	`{"choices":[{"index":00}]}`, `{"x":[[[1,2.0e1,{"y":01}]]],"choices":[]}`, "{\"choices\":[{\"text\":\"\x01\\b\"}]}",
}

// checkChunk: parseChunk reads data as encoding/json reads it into
// engineChunk, errors included.
func checkChunk(t *testing.T, data []byte) {
	got, gerr := parseChunk(data)
	want := new(engineChunk)
	werr := json.Unmarshal(data, want)
	if werr == nil && len(want.Error) == 0 {
		want.Error = flatError(data) // an error event in the flat form
	}
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("%q: parseChunk error %v, encoding/json error %v", data, gerr, werr)
	}
	if werr == nil && (!reflect.DeepEqual(got.Choices, want.Choices) || !reflect.DeepEqual(got.Connex, want.Connex) || !reflect.DeepEqual(got.Error, want.Error)) {
		t.Fatalf("%q:\nparseChunk    %+v\nencoding/json %+v", data, got, want)
	}
}

// TestParseChunkIsEncodingJSONs: the fast reading of engine chunks gives
// what encoding/json gives, for the common chunks and the odd ones alike.
func TestParseChunkIsEncodingJSONs(t *testing.T) {
	for _, s := range chunkSeeds {
		checkChunk(t, []byte(s))
	}
	if ch, err := parseChunk([]byte(chunkSeeds[1])); err != nil || ch.text() != "h\u00e9\n" || *ch.Choices[0].FinishReason != "stop" {
		t.Fatalf("%+v %v", ch, err)
	}
	// An error event in the flat form is read as an error.
	flat := `{"object":"error","message":"boom","type":"InternalServerError","code":500}`
	if ch, err := parseChunk([]byte(flat)); err != nil || string(ch.Error) != flat {
		t.Fatalf("flat error event: %+v %v; want its body as the chunk's error", ch, err)
	}
}

func FuzzParseChunk(f *testing.F) {
	for _, s := range chunkSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkChunk(t, data) })
}

// TestTokenIDs: a prefill's prompt_token_ids decode as encoding/json
// decodes []uint32, and what is not a uint32 array is an error.
func TestTokenIDs(t *testing.T) {
	for _, s := range []string{`[1,2,3]`, `[]`, `null`, `[0, 4294967295 ]`, `[4294967296]`, `[-1]`, `[1.5]`, `["1"]`, `{}`, `"x"`, `[1e2]`} {
		var got tokenIDs
		var want []uint32
		gerr := json.Unmarshal([]byte(`{"a":`+s+`}`), &struct {
			A *tokenIDs `json:"a"`
		}{&got})
		werr := json.Unmarshal([]byte(s), &want)
		if (gerr == nil) != (werr == nil) || (werr == nil && !reflect.DeepEqual([]uint32(got), want)) {
			t.Fatalf("%s: tokenIDs %v %v, encoding/json %v %v", s, got, gerr, want, werr)
		}
	}
}
