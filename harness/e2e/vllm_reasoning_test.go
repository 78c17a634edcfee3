package e2e

import (
	"context"
	"strings"
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
// reasoning as vLLM alone streams; a sampled chat without a seed (even one
// that has not reasoned) is not resumed into another answer: its stream
// ends with resume_refused naming the parser.
func testVLLMReasoning(t *testing.T, c *localcluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	thinking := func(seed int64, max int) map[string]any {
		b := vllmChat(vllmPrompt(seed, 200), max)
		b["chat_template_kwargs"] = map[string]any{"enable_thinking": true}
		return b
	}
	replays := func() float64 { return sum(must2(scrapeAs(c.RouterURL()+"/metrics", c.AdminKey())), "connex_router_resume_replays_total") }
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
	t.Run("sampled-refused", func(t *testing.T) {
		body := vllmChat(vllmPrompt(521, 200), 80) // reasoning off: content only, yet the engine's parser reads it
		body["temperature"] = 0.8
		got, victim := toolStreamFrozenAt(ctx, t, c, body, 20)
		if got.dones != 1 || len(got.errors) != 1 || !strings.HasPrefix(got.errors[0], "resume_refused: ") ||
			!strings.Contains(got.errors[0], "(reasoning)") || !strings.Contains(got.errors[0], vllmReasoningParser) {
			t.Fatalf("%d [DONE], errors %v: want one resume_refused naming the reasoning parser, then [DONE]", got.dones, got.errors)
		}
		t.Logf("%s frozen, sampled without a seed: %s", victim, got.errors[0])
	})
}
