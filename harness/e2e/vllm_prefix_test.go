package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// clusterCounter sums a series over the cluster's /metrics endpoints whose
// process name ends with suffix ("/connexd", "/engine").
func clusterCounter(t *testing.T, c *localcluster.Cluster, suffix, name string) float64 {
	t.Helper()
	var total float64
	for _, m := range c.MetricsTargets() {
		if !strings.HasSuffix(m.Process, suffix) || strings.HasPrefix(m.Process, localcluster.RouterName) {
			continue
		}
		key := ""
		if m.Admin {
			key = c.AdminKey()
		}
		got, err := scrapeAs(m.URL, key)
		if err != nil {
			t.Fatalf("scrape %s: %v", m.Process, err)
		}
		total += sum(got, name)
	}
	return total
}

// chatTurn is a greedy streamed chat of the conversation msgs.
func chatTurn(msgs []map[string]any, max int) map[string]any {
	b := vllmChat("", max)
	b["messages"] = msgs
	return b
}

// testVLLMPrefixCache (issue 45): decode vLLMs run with prefix caching on.
// A chat's second turn, whose first blocks the decode engine caches from
// the first turn, pulls only the hold's blocks past its cache hit — the
// decode connexds' pulled bytes are exactly the uncached tokens' — and its
// answer equals vLLM alone's; a third turn whose decode engine is frozen
// mid-stream resumes on the other one, also from its cache and the rest of
// the hold, equal to vLLM alone.
func testVLLMPrefixCache(t *testing.T, c *localcluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pulled := func() float64 { return clusterCounter(t, c, "/connexd", "connex_pull_bytes_total") }
	hits := func() float64 { return clusterCounter(t, c, "/engine", "vllm:prefix_cache_hits_total") }
	msgs := []map[string]any{{"role": "user", "content": vllmPrompt(700, 300)}}

	// Turn 1 through the router: its whole prompt is pulled (nothing
	// cached yet), which gives the bytes a token of KV costs.
	p0 := pulled()
	one, err := postStream(ctx, c.RouterURL()+"/v1/chat/completions", chatTurn(msgs, 40), nil)
	if err != nil || one.status != 200 || len(one.errors) > 0 || len(one.ids) != 40 {
		t.Fatalf("turn 1: %v, status %d %s, errors %v", err, one.status, one.body, one.errors)
	}
	t1 := one.usage["prompt_tokens"]
	perToken := (pulled() - p0) / float64(t1)
	if perToken <= 0 {
		t.Fatalf("turn 1 (%d prompt tokens) pulled no bytes", t1)
	}
	// Both decode engines answer the first turn alone too: each now caches
	// it, wherever the router sends the next turn (and it is the reference).
	for _, d := range []string{"decode-0", "decode-1"} {
		ref, err := postStream(ctx, engineURL(t, c, d)+"/v1/chat/completions", chatTurn(msgs, 40), nil)
		if err != nil || ref.text() != one.text() {
			t.Fatalf("turn 1 on %s alone: %v\n got %q\nwant %q", d, err, ref.text(), one.text())
		}
	}

	msgs = append(msgs, map[string]any{"role": "assistant", "content": one.text()},
		map[string]any{"role": "user", "content": vllmPrompt(701, 60)})
	ref, err := postStream(ctx, engineURL(t, c, "decode-0")+"/v1/chat/completions", chatTurn(msgs, 40), nil)
	if err != nil || ref.status != 200 {
		t.Fatalf("turn 2 on vLLM alone: %v %d", err, ref.status)
	}
	p0, h0 := pulled(), hits()
	two, err := postStream(ctx, c.RouterURL()+"/v1/chat/completions", chatTurn(msgs, 40), nil)
	if err != nil || two.status != 200 || len(two.errors) > 0 {
		t.Fatalf("turn 2: %v, status %d %s, errors %v", err, two.status, two.body, two.errors)
	}
	if two.text() != ref.text() {
		t.Fatalf("turn 2 through the router differs from vLLM alone's:\n got %q\nwant %q", two.text(), ref.text())
	}
	t2, hit, bytes := two.usage["prompt_tokens"], hits()-h0, pulled()-p0
	if hit < float64(vllmDecodeBlockSize) {
		t.Fatalf("turn 2 (%d prompt tokens) hit %v cached tokens on its decode engine, want at least a block of %d", t2, hit, vllmDecodeBlockSize)
	}
	if want := perToken * (float64(t2) - hit); bytes != want {
		t.Fatalf("turn 2 pulled %v bytes, want %v: the %v of its %d prompt tokens its decode engine did not cache, at %v bytes a token",
			bytes, want, float64(t2)-hit, t2, perToken)
	}
	t.Logf("turn 2: %d prompt tokens, %v cached on the decode engine, %v bytes pulled (the rest); turn 1 pulled all %d", t2, hit, bytes, t1)

	// Turn 3, frozen mid-stream: resumed on the other decode engine, which
	// caches the conversation up to turn 2's question (its reference run).
	msgs = append(msgs, map[string]any{"role": "assistant", "content": two.text()},
		map[string]any{"role": "user", "content": vllmPrompt(702, 40)})
	for _, d := range []string{"decode-1", "decode-0"} {
		r, err := postStream(ctx, engineURL(t, c, d)+"/v1/chat/completions", chatTurn(msgs, 60), nil)
		if err != nil || r.status != 200 {
			t.Fatalf("turn 3 on %s alone: %v", d, err)
		}
		ref = r
	}
	p0, h0 = pulled(), hits()
	three, victim := streamFrozenAt(ctx, t, c, "/v1/chat/completions", chatTurn(msgs, 60), 20)
	if three.status != 200 || len(three.errors) > 0 || three.text() != ref.text() {
		t.Fatalf("turn 3, %s frozen: status %d, errors %v\n got %q\nwant %q", victim, three.status, three.errors, three.text(), ref.text())
	}
	if hit := hits() - h0; hit < 2*float64(vllmDecodeBlockSize) {
		t.Fatalf("turn 3's two decode legs hit %v cached tokens, want a hit on each", hit)
	}
	t.Logf("turn 3: %s frozen after 20 tokens, resumed equal to vLLM alone's; %v cached tokens hit, %v bytes pulled over both legs", victim, hits()-h0, pulled()-p0)
}
