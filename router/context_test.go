package router

import (
	"strings"
	"testing"

	"github.com/connex/connex/messages"
)

func TestContextLimit(t *testing.T) {
	eng := func(model string, maxLen, blocks, bs uint32) Engine {
		return Engine{Info: &messages.EngineInfo{Model: model, MaxModelLen: maxLen, BlocksTotal: blocks, BlockSize: bs}}
	}
	for _, c := range []struct {
		name    string
		engines []Engine
		want    int
	}{
		{"none", nil, 0},
		{"unknown", []Engine{eng("m", 0, 0, 0)}, 0},
		{"max_model_len", []Engine{eng("m", 4096, 0, 0)}, 4096},
		{"the region is smaller", []Engine{eng("m", 16384, 512, 16)}, 8192},
		{"only the region is known", []Engine{eng("m", 0, 64, 16)}, 1024},
		{"the smallest engine of the model", []Engine{eng("m", 16384, 512, 16), eng("m", 2048, 512, 16), eng("other", 10, 1, 1)}, 2048},
	} {
		if got := ContextLimit(c.engines, "m"); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

func TestCheckContext(t *testing.T) {
	parse := func(kind Kind, body string) *ClientRequest {
		c, e := ParseClient(kind, []byte(body))
		if e != nil {
			t.Fatalf("%s: %v", body, e.Message)
		}
		return c
	}
	for _, c := range []struct {
		req    *ClientRequest
		prompt int
		param  string // "" : accepted
		words  []string
	}{
		{parse(Completions, `{"model":"m","prompt":"p","max_tokens":5}`), 2000, "prompt", []string{"1024", "2000"}},
		{parse(Completions, `{"model":"m","prompt":"p","max_tokens":5}`), 1024, "prompt", []string{"1024"}},
		{parse(Completions, `{"model":"m","prompt":"p","max_tokens":100}`), 1000, "max_tokens", []string{"1024", "1100", "1000 in the prompt"}},
		{parse(Completions, `{"model":"m","prompt":"p","max_tokens":100000000}`), 0, "max_tokens", []string{"1024", "100000000"}},
		{parse(Completions, `{"model":"m","prompt":"p","max_tokens":1023}`), 0, "", nil},
		{parse(Completions, `{"model":"m","prompt":"p","max_tokens":24}`), 1000, "", nil},
		{parse(Chat, `{"model":"m","messages":[{"role":"user","content":"x"}]}`), 1024, "messages", nil},
		{parse(Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":2000}`), 0, "max_completion_tokens", nil},
		{parse(Chat, `{"model":"m","messages":[{"role":"user","content":"x"}]}`), 1000, "", nil},
	} {
		e := CheckContext(c.req, c.prompt, 1024)
		if c.param == "" {
			if e != nil {
				t.Errorf("prompt %d max %d: refused: %s", c.prompt, c.req.MaxTokens, e.Message)
			}
			continue
		}
		if e == nil || e.Status != 400 || e.Code != CodeContextLength || e.Param == nil || *e.Param != c.param {
			t.Errorf("prompt %d max %d: %+v, want 400 context_length_exceeded naming %s", c.prompt, c.req.MaxTokens, e, c.param)
			continue
		}
		for _, w := range c.words {
			if !strings.Contains(e.Message, w) {
				t.Errorf("prompt %d max %d: %q does not say %q", c.prompt, c.req.MaxTokens, e.Message, w)
			}
		}
	}
	if CheckContext(parse(Completions, `{"model":"m","prompt":"p","max_tokens":100000000}`), 0, 0) != nil {
		t.Error("no known limit refused a request")
	}
	if c := parse(Completions, `{"model":"m","prompt":[1,2,3]}`); promptTokens(c) != 3 {
		t.Errorf("token-id prompt length %d, want 3", promptTokens(c))
	}
}

// TestContextCheckDoesNotWrap: a max_tokens near the int range is refused
// with context_length_exceeded (it wrapped a sum to a negative and passed,
// and the prefill ran for an answer the decode engine then refused).
func TestContextCheckDoesNotWrap(t *testing.T) {
	c, aerr := ParseClient(Completions, []byte(`{"model":"m","prompt":"abc","max_tokens":9223372036854775807}`))
	if aerr != nil {
		t.Fatalf("parse: %v", aerr)
	}
	for _, prompt := range []int{0, 3} {
		if err := CheckContext(c, prompt, 4096); err == nil || err.Code != CodeContextLength {
			t.Fatalf("prompt %d, max_tokens 2^63-1 within 4096: %v", prompt, err)
		}
	}
	if needsCount(c, 4096) != true {
		t.Fatal("needsCount says a request with max_tokens 2^63-1 surely fits 4096")
	}
}
