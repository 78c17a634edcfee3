package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

// TestRefusedBeforePrefill: a request a decode engine would refuse (a
// sampling value out of vLLM's range) is refused by the router with an
// OpenAI-shaped 400 before its prefill leg: the prefill engine's prefill
// count does not move, and no hold is left for nobody.
func TestRefusedBeforePrefill(t *testing.T) {
	c := startProduct(t, nil)
	waitEngines(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := c.RouterURL() + "/v1/completions"
	before := engineMetric(t, c, "prefill", "connex_sim_prefills_total")
	for _, bad := range []map[string]any{
		{"temperature": -5}, {"top_p": 0}, {"top_k": -7}, {"presence_penalty": 3}, {"repetition_penalty": 0},
		{"min_tokens": 9, "max_tokens": 4},
	} {
		body := map[string]any{"model": "connex-sim", "prompt": "refused before prefill", "max_tokens": 4}
		for k, v := range bad {
			body[k] = v
		}
		status, ans, err := postJSON(ctx, url, body)
		e, _ := ans["error"].(map[string]any)
		if err != nil || status != 400 || e == nil || e["type"] != "invalid_request_error" || e["param"] == nil {
			b, _ := json.Marshal(ans)
			t.Fatalf("%v: %d %s (%v), want an OpenAI 400 naming the field", bad, status, b, err)
		}
	}
	if after := engineMetric(t, c, "prefill", "connex_sim_prefills_total"); after != before {
		t.Fatalf("refused requests cost %v prefills", after-before)
	}
	// A valid request still costs exactly one.
	if status, _, err := postJSON(ctx, url, map[string]any{"model": "connex-sim", "prompt": "valid", "max_tokens": 4, "temperature": 0.7}); err != nil || status != 200 {
		t.Fatalf("valid request: %d %v", status, err)
	}
	if after := engineMetric(t, c, "prefill", "connex_sim_prefills_total"); after != before+1 {
		t.Fatalf("a valid request cost %v prefills, want 1", after-before)
	}
}
