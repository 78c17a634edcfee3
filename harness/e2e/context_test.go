package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// routerMaxModelLen is the max_model_len the router's /v1/models gives model.
func routerMaxModelLen(t *testing.T, base, model string) int {
	t.Helper()
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	for _, m := range list.Data {
		if m.ID == model {
			return m.MaxModelLen
		}
	}
	t.Fatalf("/v1/models does not list %s", model)
	return 0
}

// TestContextLimitIsTheRealOne: the engines' KV regions hold 64 blocks of 16
// tokens (1024) while --max-model-len says 16384. The router advertises
// 1024 and refuses beyond it with OpenAI's 400 context_length_exceeded,
// naming the prompt's length and the limit and blaming the prompt when the
// prompt alone does not fit; max_tokens beyond the context costs no
// prefill; a request that fits is served.
func TestContextLimitIsTheRealOne(t *testing.T) {
	c := startProduct(t, func(o *localcluster.Options) {
		o.Decode = 1
		o.Blocks = 64
		o.MaxModelLen = 16384
	})
	waitEngines(t, c)
	nc := connect(t, c.NATSURL())
	base := c.RouterURL()
	if got := routerMaxModelLen(t, base, "connex-sim"); got != 1024 {
		t.Fatalf("max_model_len %d, want 1024 (64 blocks × 16 tokens)", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := base + "/v1/completions"
	refused := func(body map[string]any, param string, words ...string) {
		t.Helper()
		body["model"] = "connex-sim"
		status, ans, err := postJSON(ctx, url, body)
		e, _ := ans["error"].(map[string]any)
		msg, _ := e["message"].(string)
		if err != nil || status != 400 || e["code"] != "context_length_exceeded" || e["param"] != param {
			t.Fatalf("%d %v (%v), want 400 context_length_exceeded naming %s", status, ans, err, param)
		}
		for _, w := range words {
			if !strings.Contains(msg, w) {
				t.Fatalf("%q does not say %q", msg, w)
			}
		}
	}
	prefills := func() float64 { return engineMetric(t, c, "prefill", "connex_sim_prefills_total") }
	before := prefills()
	// max_tokens beyond the context: refused before the prefill.
	refused(map[string]any{"prompt": "short", "max_tokens": 100000000}, "max_tokens", "1024", "100000000")
	// A token-id prompt's length is known: refused before the prefill.
	ids := make([]int, 2000)
	for i := range ids {
		ids[i] = 'a'
	}
	refused(map[string]any{"prompt": ids, "max_tokens": 5}, "prompt", "1024", "2000 tokens")
	if n := prefills() - before; n != 0 {
		t.Fatalf("requests refused before the prefill cost %v prefills", n)
	}
	// A text prompt beyond the context, with a small max_tokens: the
	// prompt's fault (it was blamed on max_tokens). The router counts it
	// with the engine's tokenizer (POST /tokenize) before any prefill.
	refused(map[string]any{"prompt": strings.Repeat("y", 2000), "max_tokens": 5}, "prompt", "1024", "2000 tokens")
	// A text prompt that fits, with too many tokens asked: refused before
	// the prefill too.
	refused(map[string]any{"prompt": strings.Repeat("z", 1000), "max_tokens": 100}, "max_tokens", "1024", "1000 in the prompt")
	// Chat: the rendered conversation is counted the same way.
	chat := func(body map[string]any) (int, map[string]any) {
		t.Helper()
		body["model"] = "connex-sim"
		status, ans, err := postJSON(ctx, base+"/v1/chat/completions", body)
		if err != nil {
			t.Fatal(err)
		}
		return status, ans
	}
	status, ans := chat(map[string]any{"messages": []map[string]string{{"role": "user", "content": strings.Repeat("c", 900)}}, "max_tokens": 200})
	if e, _ := ans["error"].(map[string]any); status != 400 || e["code"] != "context_length_exceeded" || e["param"] != "max_tokens" {
		t.Fatalf("chat over the context: %d %v, want 400 context_length_exceeded naming max_tokens", status, ans)
	}
	if n := prefills() - before; n != 0 {
		t.Fatalf("text prompts refused before the prefill cost %v prefills", n)
	}
	if n := engineMetric(t, c, "prefill", "connex_sim_tokenize_total"); n != 3 {
		t.Errorf("the prefill engine counted %v prompts, want 3 (the text prompts near the limit)", n)
	}
	checkFor(t, 2*time.Second, 20*time.Millisecond, func() error {
		if held, err := prefillHeld(t, nc, c); err != nil || held != 0 {
			return fmt.Errorf("prefill blocks held: %d (%v)", held, err)
		}
		return nil
	})
	// Within the limit: served.
	if status, ans, err := postJSON(ctx, url, map[string]any{"model": "connex-sim", "prompt": strings.Repeat("w", 900), "max_tokens": 100}); err != nil || status != 200 {
		t.Fatalf("a request within the context: %d %v %v", status, ans, err)
	}
	// Counted (near the limit) and served with exactly one prefill.
	if n := prefills() - before; n != 1 {
		t.Errorf("a request within the context cost %v prefills, want 1", n)
	}
}
