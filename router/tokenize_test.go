package router

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestNeedsCount(t *testing.T) {
	long := strings.Repeat("x", 900)
	for _, tc := range []struct {
		name  string
		kind  Kind
		body  string
		limit int
		want  bool
	}{
		{"no limit", Completions, `{"prompt":"` + long + `","max_tokens":100}`, 0, false},
		{"surely fits", Completions, `{"prompt":"short","max_tokens":100}`, 1024, false},
		{"may not fit", Completions, `{"prompt":"` + long + `","max_tokens":100}`, 1024, true},
		{"no max_tokens counts as one", Completions, `{"prompt":"` + long + `"}`, 960, true},
		{"no max_tokens, far below", Completions, `{"prompt":"short"}`, 1024, false},
		{"token ids are counted already", Completions, `{"prompt":[1,2,3],"max_tokens":2000}`, 1024, false},
		{"a batch is not bounded", Completions, `{"prompt":["a","b"],"max_tokens":2000}`, 1024, false},
		{"chat near the limit", Chat, `{"messages":[{"role":"user","content":"` + long + `"}],"max_tokens":50}`, 1024, true},
		{"chat far below", Chat, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":50}`, 1024, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &ClientRequest{Kind: tc.kind}
			if err := json.Unmarshal([]byte(tc.body), &c.Body); err != nil {
				t.Fatal(err)
			}
			_ = json.Unmarshal(c.Body["max_tokens"], &c.MaxTokens)
			if got := needsCount(c, tc.limit); got != tc.want {
				t.Errorf("needsCount = %v, want %v", got, tc.want)
			}
		})
	}
}

// The bound never undercounts: a prompt of n bytes is bounded by at least n
// (one token per byte is the most a byte-level tokenizer makes).
func TestPromptTextBoundsBytes(t *testing.T) {
	for _, p := range []string{"a", "héllo wörld", strings.Repeat("\u00e9", 300), "\"quoted\"\n"} {
		body, _ := json.Marshal(map[string]any{"prompt": p})
		c := &ClientRequest{Kind: Completions}
		if err := json.Unmarshal(body, &c.Body); err != nil {
			t.Fatal(err)
		}
		if _, _, bound, ok := promptText(c); !ok || bound < len(p) {
			t.Errorf("%q: bound %d (ok %v), want at least %d", p, bound, ok, len(p))
		}
		msgs, _ := json.Marshal(map[string]any{"messages": []map[string]string{{"role": "user", "content": p}}})
		c = &ClientRequest{Kind: Chat}
		if err := json.Unmarshal(msgs, &c.Body); err != nil {
			t.Fatal(err)
		}
		if _, _, bound, ok := promptText(c); !ok || bound < len(p) {
			t.Errorf("chat %q: bound %d (ok %v), want at least %d", p, bound, ok, len(p))
		}
	}
}
