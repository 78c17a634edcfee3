//go:build ucx

package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// vllmTP is each engine's tensor-parallel size in TestVLLMTP: a prefill
// engine and a decode engine of each size, so that every pairing of
// sizes is a pull connexd translates (or moves whole, for equal sizes).
var vllmTP = map[string]int{"prefill-0": 2, "prefill-1": 1, "decode-0": 1, "decode-1": 2}

// TestVLLMTP runs real `vllm serve` engines of tensor-parallel sizes 1 and
// 2 (one worker process per rank, each rank's KV in a connexd region of its
// own): the KV of a prompt prefilled at one size is pulled at the other,
// and a decode engine killed mid-stream is resumed on an engine of the
// other size. Every answer equals vLLM alone.
func TestVLLMTP(t *testing.T) {
	bin, model := vllmEnv(t)
	bins := productBinaries(t)
	o := localcluster.Defaults()
	o.Connexd = bins.Connexd
	o.Model = vllmModel
	o.LogLevel = "info"
	o.Prefill, o.Decode = 2, 2
	// Four engines here run six model processes (two TP-2 engines have a
	// worker per rank) beside five connexds on this 2-core machine. A pull's
	// stall rule (pull_stall_ms, 1 s by default) is not what this test is
	// about (harness/e2e/holder_failure_test.go is), and once in a CI run
	// its first pull saw no byte for 1 s while the holder's connexd waited
	// for a core (the decode engine's `fail` policy then ended the request
	// with a 500). The first read on a fresh UCX endpoint costs 0.2-20 ms
	// here, under the same load as much as a warm one. 3 s keeps the rule
	// armed and out of the scheduler's way.
	o.ConnexdArgs = append(o.ConnexdArgs, "--pull-stall-ms", "3000")
	o.VLLM = &localcluster.VLLM{Bin: bin, Model: model, MaxModelLen: 2048, TPFor: vllmTP, LogDir: t.TempDir()}
	logs := &safeBuffer{}
	o.Log = logs
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := localcluster.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("four vllm serve engines (TP %v) and five connexds ready in %s", vllmTP, time.Since(start).Round(time.Second))
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
		if t.Failed() {
			t.Logf("cluster log (tail):\n%s", tail(logs.String(), 8000))
			for name := range vllmTP {
				if b, err := os.ReadFile(filepath.Join(o.VLLM.LogDir, name+".log")); err == nil {
					t.Logf("%s's log (tail):\n%s", name, tail(string(b), 6000))
				}
			}
		}
	})
	const max = 96
	// vLLM alone at each size: the prefill engines asked directly (they
	// cache no prefix, so each computes the whole prompt). The sizes must
	// agree, or no answer that crosses them could equal "vLLM alone".
	alone := func(t *testing.T, prompt string) *streamed {
		t.Helper()
		var want *streamed
		for _, p := range []string{"prefill-1", "prefill-0"} {
			ref, err := postStream(ctx, engineURL(t, c, p)+"/v1/completions", vllmCompletion(prompt, max), nil)
			if err != nil || ref.status != 200 || len(ref.ids) != max {
				t.Fatalf("vLLM alone on %s (TP %d): %v, status %d %s, %d tokens", p, vllmTP[p], err, ref.status, ref.body, len(ref.ids))
			}
			if want != nil && fmt.Sprint(ref.ids) != fmt.Sprint(want.ids) {
				t.Fatalf("vLLM alone answers differently at TP 1 and TP 2:\nTP 1 %v\nTP 2 %v", want.ids, ref.ids)
			}
			want = ref
		}
		return want
	}

	// Every pairing of sizes, legs sent as vLLM's own P/D proxies send them
	// (the prefill's kv_transfer_params handed to the decode engine).
	seed := int64(700)
	for _, p := range []string{"prefill-0", "prefill-1"} {
		for _, d := range []string{"decode-0", "decode-1"} {
			seed++
			t.Run(fmt.Sprintf("tp%d-to-tp%d", vllmTP[p], vllmTP[d]), func(t *testing.T) {
				prompt := vllmPrompt(seed, 300)
				want := alone(t, prompt)
				loaded := vllmSource(t, engineURL(t, c, d), "external_kv_transfer")
				got := pdLegs(ctx, t, engineURL(t, c, p), engineURL(t, c, d), vllmCompletion(prompt, max))
				if fmt.Sprint(got.ids) != fmt.Sprint(want.ids) {
					t.Fatalf("%s (TP %d) -> %s (TP %d) differs from vLLM alone:\n got %v\nwant %v", p, vllmTP[p], d, vllmTP[d], got.ids, want.ids)
				}
				if n := vllmSource(t, engineURL(t, c, d), "external_kv_transfer") - loaded; n < float64(want.usage["prompt_tokens"]-128) {
					t.Fatalf("%s loaded %v tokens of KV from the hold, want the prompt's %d less at most one block", d, n, want.usage["prompt_tokens"])
				}
			})
		}
	}

	// Through the router: the decode engine is killed mid-stream and the
	// request resumes on the other decode engine, of the other size.
	t.Run("resume-across-tp-SIGKILL", func(t *testing.T) {
		prompt := vllmPrompt(777, 300)
		want := alone(t, prompt)
		before := map[string]float64{}
		for _, d := range []string{"decode-0", "decode-1"} {
			before[d] = vllmSource(t, engineURL(t, c, d), "external_kv_transfer")
		}
		var victim, prefill string
		var faultErr error
		got, err := postStream(ctx, c.RouterURL()+"/v1/completions", vllmCompletion(prompt, max), func(n int, s *streamed) {
			if n == 24 {
				victim, prefill = s.header.Get("X-Connex-Decode-Engine"), s.header.Get("X-Connex-Prefill-Engine")
				faultErr = c.Kill(victim + "/engine")
			}
		})
		if err != nil || faultErr != nil || victim == "" {
			t.Fatalf("stream: %v; fault: %v; decode engine %q", err, faultErr, victim)
		}
		other := map[string]string{"decode-0": "decode-1", "decode-1": "decode-0"}[victim]
		if got.status != 200 || got.dones != 1 || len(got.errors) > 0 {
			t.Fatalf("after SIGKILL of %s: status %d %s, %d [DONE], errors %v", victim, got.status, got.body, got.dones, got.errors)
		}
		if fmt.Sprint(got.ids) != fmt.Sprint(want.ids) {
			t.Fatalf("resumed from %s (TP %d) on %s (TP %d): differs from vLLM alone:\n got %v\nwant %v", victim, vllmTP[victim], other, vllmTP[other], got.ids, want.ids)
		}
		if n := vllmSource(t, engineURL(t, c, other), "external_kv_transfer") - before[other]; n == 0 {
			t.Fatalf("%s resumed the request without loading its KV from the hold", other)
		}
		if r, _ := got.connex["resumes"].(float64); r != 1 {
			t.Fatalf("the answer's connex record %v: want 1 resume", got.connex)
		}
		t.Logf("prefilled on %s (TP %d), SIGKILL of %s (TP %d) after 24 tokens, resumed on %s (TP %d): %d tokens equal to vLLM alone",
			prefill, vllmTP[prefill], victim, vllmTP[victim], other, vllmTP[other], len(got.ids))
	})

	// Every hold ended (released by its decode engine): each prefill
	// engine's blocks are back, in every rank.
	checkFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		for _, p := range []string{"prefill-0", "prefill-1"} {
			if u := vllmMetric(t, engineURL(t, c, p), "vllm:kv_cache_usage_perc"); u != 0 {
				return fmt.Errorf("%s's KV cache is %.4f used after every request: its held blocks are not back", p, u)
			}
		}
		return nil
	})
}

// pdLegs sends a streamed completion (body) as vLLM's P/D proxies do: a
// one-token prefill leg with do_remote_decode to prefillURL, then the
// streamed decode leg to decodeURL carrying the kv_transfer_params the
// prefill answered with.
func pdLegs(ctx context.Context, t *testing.T, prefillURL, decodeURL string, body map[string]any) *streamed {
	t.Helper()
	p := maps.Clone(body)
	p["max_tokens"], p["stream"] = 1, false
	delete(p, "stream_options")
	p["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false}
	status, ans, err := postJSON(ctx, prefillURL+"/v1/completions", p)
	if err != nil || status != 200 {
		t.Fatalf("prefill leg to %s: %v, status %d %v", prefillURL, err, status, ans)
	}
	params, ok := ans["kv_transfer_params"].(map[string]any)
	if !ok || params["transfer_id"] == nil {
		t.Fatalf("prefill leg to %s answered no hold (kv_transfer_params %v)", prefillURL, ans["kv_transfer_params"])
	}
	d := maps.Clone(body)
	d["kv_transfer_params"] = params
	got, err := postStream(ctx, decodeURL+"/v1/completions", d, nil)
	if err != nil || got.status != 200 || got.dones != 1 || len(got.ids) != body["max_tokens"] {
		t.Fatalf("decode leg to %s: %v, status %d %s, %d tokens", decodeURL, err, got.status, got.body, len(got.ids))
	}
	return got
}
