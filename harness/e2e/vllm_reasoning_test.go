package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// vllmReasoningParser is the test engines' --reasoning-parser, as `make
// run-vllm` runs them: Gemma 4's, which reasons only when a chat asks
// (chat_template_kwargs enable_thinking: the tiny template then opens a
// reasoning channel) and leaves completions alone, so structured
// completions are constrained from their first token.
const vllmReasoningParser = "gemma4"

// testVLLMReasoning: on engines that run a reasoning parser, a chat that
// reasons, frozen mid-reasoning, resumes by replay with the same
// reasoning as vLLM alone streams, and so does a sampled one the client
// sent without a seed (the router seeds it).
func testVLLMReasoning(t *testing.T, c *localcluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	thinking := func(seed int64, max int) map[string]any {
		b := vllmChat(vllmPrompt(seed, 200), max)
		b["chat_template_kwargs"] = map[string]any{"enable_thinking": true}
		return b
	}
	routerMetric := func(name string) float64 { return sum(must2(scrapeAs(c.RouterURL()+"/metrics", c.AdminKey())), name) }
	replays := func() float64 { return routerMetric("connex_router_resume_replays_total") }
	t.Run("thinking-frozen-replayed", func(t *testing.T) {
		body := thinking(520, 80)
		ref, err := postToolStream(ctx, engineURL(t, c, "decode-1")+"/v1/chat/completions", body, nil)
		if err != nil || ref.dones != 1 || len(ref.errors) != 0 || ref.reasoning == "" {
			t.Fatalf("reference from vLLM alone: %v, %+v: want a reasoning answer", err, ref)
		}
		before := replays()
		got, victim := toolStreamFrozenAt(ctx, t, c, body, 20)
		if got.dones != 1 || len(got.errors) != 0 || got.reasoning != ref.reasoning || got.content != ref.content || got.finish != ref.finish {
			t.Fatalf("resumed: %d [DONE], errors %v, finish %q (want %q)\n got reasoning %q content %q\nwant reasoning %q content %q",
				got.dones, got.errors, got.finish, ref.finish, got.reasoning, got.content, ref.reasoning, ref.content)
		}
		if d := replays() - before; d != 1 {
			t.Fatalf("connex_router_resume_replays_total rose by %v, want 1", d)
		}
		t.Logf("%s frozen mid-reasoning after 20 chunks: replayed, reasoning (%d bytes) equal to vLLM alone's", victim, len(got.reasoning))
	})
	// A structured completion whose prompt opens the reasoning channel: vLLM
	// holds its grammar until the reasoning ends (the tiny model does not
	// end it), and so does the engine that resumes it — the connector asks
	// the request's reasoner and leaves the grammar waiting, instead of
	// feeding it the reasoning (which it would reject) or refusing.
	t.Run("structured-still-reasoning-resumed", func(t *testing.T) {
		body := structuredCompletion(vllmPrompt(522, 200)+"<|channel>thought\n", map[string]any{"regex": "Answer: [a-z]{1,6}"})
		body["max_tokens"] = 60
		ref, err := postStream(ctx, engineURL(t, c, "decode-1")+"/v1/completions", body, nil)
		if err != nil || ref.status != 200 || len(ref.ids) < 30 {
			t.Fatalf("reference from vLLM alone: %v, status %d %s, %d tokens (want 30 or more, to freeze it after 20)", err, ref.status, ref.body, len(ref.ids))
		}
		resumes, replayed := routerMetric("connex_router_resumes_total"), replays()
		got, victim := streamFrozenAt(ctx, t, c, "/v1/completions", body, 20)
		if d, r := routerMetric("connex_router_resumes_total")-resumes, replays()-replayed; d != 1 || r != 0 {
			t.Fatalf("the router resumed %v times (%v by replay), want one prefix resume: the freeze must land mid-answer", d, r)
		}
		if got.status != 200 || got.dones != 1 || len(got.errors) != 0 || fmt.Sprint(got.ids) != fmt.Sprint(ref.ids) {
			t.Fatalf("%s frozen: status %d, errors %v\n got %v\nwant %v", victim, got.status, got.errors, got.ids, ref.ids)
		}
		t.Logf("%s frozen after 20 tokens of an open reasoning: resumed by prefix, the grammar still waiting, %d tokens equal to vLLM alone's", victim, len(got.ids))
	})
	// A sampled thinking chat without a seed: the router seeds it, and
	// frozen mid-reasoning it is replayed into the answer the request with
	// that seed gets uninterrupted.
	t.Run("sampled-replayed", func(t *testing.T) {
		body := thinking(521, 80)
		body["temperature"] = 0.8
		before := replays()
		got, victim := toolStreamFrozenAt(ctx, t, c, body, 20)
		if d := replays() - before; d != 1 {
			t.Fatalf("connex_router_resume_replays_total rose by %v, want 1", d)
		}
		seed, ok := got.connex["seed"].(float64)
		if got.dones != 1 || len(got.errors) != 0 || !ok {
			t.Fatalf("%d [DONE], errors %v, connex %v: want the replayed answer with the router's seed in its record", got.dones, got.errors, got.connex)
		}
		// The reference: the same request with that seed, uninterrupted,
		// through the router (see testVLLMTools' sampled case).
		body["seed"] = int64(seed)
		ref, err := postToolStream(ctx, c.RouterURL()+"/v1/chat/completions", body, nil)
		if err != nil || ref.dones != 1 || ref.reasoning == "" || ref.connex["resumes"] != float64(0) {
			t.Fatalf("uninterrupted reference with seed %d: %v, %+v: want a reasoning answer", int64(seed), err, ref)
		}
		if got.reasoning != ref.reasoning || got.content != ref.content || got.finish != ref.finish {
			t.Fatalf("resumed: finish %q (want %q)\n got reasoning %q content %q\nwant reasoning %q content %q",
				got.finish, ref.finish, got.reasoning, got.content, ref.reasoning, ref.content)
		}
		t.Logf("%s frozen mid-reasoning, sampled without a seed: seeded (%d), replayed, reasoning (%d bytes) equal to the uninterrupted answer with that seed", victim, int64(seed), len(got.reasoning))
	})
}
