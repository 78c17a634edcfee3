//go:build ucx

package e2e

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// The sliding model (make_model.py --size sliding) as TestVLLMHybrid
// serves it: every other layer reads a window of slidingWindow tokens,
// every engine keeps blocks of hybridBlockSize tokens.
const (
	slidingWindow   = 64
	hybridBlockSize = 32
	// hybridRegionBlockBytes is one block of every region layer: vLLM's
	// hybrid manager lays layer k of each KV cache group on the same bytes
	// (2 region layers for 4 model layers), each block of a layer 2 KV
	// heads x 32 tokens x (K and V of 64 floats) x 4 bytes.
	hybridRegionBlockBytes = 2 * (2 * hybridBlockSize * 2 * 64 * 4)
)

// slidingModel makes (once; make_model.py leaves a current one alone) the
// tiny sliding-window model beside the tiny model, with the engines'
// Python.
func slidingModel(t *testing.T, bin, tiny string) string {
	t.Helper()
	out := filepath.Join(filepath.Dir(tiny), "tiny-sliding")
	cmd := exec.Command(filepath.Join(filepath.Dir(bin), "python"), "../../engine/vllm-connector/vllm-cpu/make_model.py", out, "--size", "sliding")
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make_model.py --size sliding: %v\n%s", err, b)
	}
	return out
}

// idPrompt is a greedy streamed completion of max tokens for a prompt of
// exactly n token ids (seeded), so that the test knows where each block
// and window boundary falls. The first k ids of a prompt are those of any
// longer one of the same seed.
func idPrompt(seed int64, n, max int) map[string]any {
	r := rand.New(rand.NewSource(seed))
	ids := make([]int, n)
	for i := range ids {
		ids[i] = 16 + r.Intn(2000) // past the special tokens
	}
	b := vllmCompletion("", max)
	b["prompt"] = ids
	return b
}

// hybridHeld is how many blocks a hold of n tokens keeps: every block of
// the full-attention group, and the sliding group's from the first one
// its window still reads (vLLM drops the blocks before token n-W+1).
func hybridHeld(n int) int {
	full := (n + hybridBlockSize - 1) / hybridBlockSize
	return full + full - max(0, n-slidingWindow+1)/hybridBlockSize
}

// TestVLLMHybrid serves a model of sliding-window and full-attention
// layers with vLLM's hybrid KV cache manager on (the connector declares
// SupportsHMA): a hold spans both KV cache groups, a pull moves every
// full-attention block and only the sliding window's last blocks, and a
// decode engine killed mid-stream resumes; every answer equals vLLM alone.
func TestVLLMHybrid(t *testing.T) {
	bin, tiny := vllmEnv(t)
	model := slidingModel(t, bin, tiny)
	bins := productBinaries(t)
	o := localcluster.Defaults()
	o.Connexd = bins.Connexd
	o.Model = vllmModel
	o.LogLevel = "info"
	o.Metrics = true
	o.VLLM = &localcluster.VLLM{Bin: bin, Model: model, MaxModelLen: 2048, LogDir: t.TempDir(),
		Args: []string{"--block-size", fmt.Sprint(hybridBlockSize)}}
	logs := &safeBuffer{}
	o.Log = logs
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := localcluster.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("three vllm serve engines of the sliding model ready in %s", time.Since(start).Round(time.Second))
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
		if t.Failed() {
			t.Logf("cluster log (tail):\n%s", tail(logs.String(), 8000))
			for _, name := range []string{"prefill-0", "decode-0", "decode-1"} {
				if b, err := os.ReadFile(filepath.Join(o.VLLM.LogDir, name+".log")); err == nil {
					t.Logf("%s's log (tail):\n%s", name, tail(string(b), 6000))
				}
			}
		}
	})
	// The hybrid manager stayed on: vLLM says when a connector turns it off.
	for _, name := range []string{"prefill-0", "decode-0"} {
		b, err := os.ReadFile(filepath.Join(o.VLLM.LogDir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		if line := lastLine(string(b), "", "Turning off hybrid kv cache manager"); line != "" {
			t.Fatalf("%s: %s", name, line)
		}
	}
	prefillURL := engineURL(t, c, "prefill-0")
	const max = 96
	alone := func(t *testing.T, body map[string]any) *streamed {
		t.Helper()
		ref, err := postStream(ctx, prefillURL+"/v1/completions", body, nil)
		if err != nil || ref.status != 200 || len(ref.ids) != max {
			t.Fatalf("vLLM alone: %v, status %d %s, %d tokens", err, ref.status, ref.body, len(ref.ids))
		}
		return ref
	}
	pulled := func() float64 { return clusterCounter(t, c, "/connexd", "connex_pull_bytes_total") }
	loadedBy := func() map[string]float64 {
		out := map[string]float64{}
		for _, d := range []string{"decode-0", "decode-1"} {
			out[d] = vllmSource(t, engineURL(t, c, d), "external_kv_transfer")
		}
		return out
	}

	t.Run("hold-spans-both-groups", func(t *testing.T) {
		const n = 300
		body := idPrompt(901, n, max)
		want := alone(t, body)
		p0, l0 := pulled(), loadedBy()
		got, err := postStream(ctx, c.RouterURL()+"/v1/completions", body, nil)
		if err != nil || got.status != 200 || got.dones != 1 || fmt.Sprint(got.ids) != fmt.Sprint(want.ids) {
			t.Fatalf("through Connex: %v, status %d %s\n got %v\nwant %v", err, got.status, got.body, got.ids, want.ids)
		}
		d := got.header.Get("X-Connex-Decode-Engine")
		if l := loadedBy()[d] - l0[d]; l != n {
			t.Fatalf("%s loaded %v tokens of KV, want the prompt's %d", d, l, n)
		}
		// Every full-attention block and the window's last blocks: not
		// twice the full blocks, as a hold without the groups would be.
		held := hybridHeld(n)
		if b := pulled() - p0; b != float64(held*hybridRegionBlockBytes) {
			t.Fatalf("the pull moved %v bytes, want %d blocks of %d bytes (10 full-attention, %d of the window)", b, held, hybridRegionBlockBytes, held-10)
		}
		t.Logf("%d-token prompt: %d blocks pulled (%d bytes), not %d", n, held, held*hybridRegionBlockBytes, 2*10)
	})

	t.Run("window-edge-computed-locally", func(t *testing.T) {
		// 319 tokens: the blocks before token 256 are dropped, and the
		// last prompt token reads key 255, which only a local prefill has.
		const n = 319
		body := idPrompt(902, n, max)
		want := alone(t, body)
		l0 := loadedBy()
		got, err := postStream(ctx, c.RouterURL()+"/v1/completions", body, nil)
		if err != nil || got.status != 200 || fmt.Sprint(got.ids) != fmt.Sprint(want.ids) {
			t.Fatalf("through Connex: %v, status %d %s\n got %v\nwant %v", err, got.status, got.body, got.ids, want.ids)
		}
		d := got.header.Get("X-Connex-Decode-Engine")
		if l := loadedBy()[d] - l0[d]; l != 0 {
			t.Fatalf("%s loaded %v tokens of KV for a prompt ending at a window's edge; want it computed locally", d, l)
		}
	})

	t.Run("prefix-hit-pulls-each-group-s-rest", func(t *testing.T) {
		// Turn 1 (300 tokens) leaves its blocks in decode-0's prefix cache;
		// turn 2 (320 tokens, turn 1's first) hits 288 of them (9 whole
		// blocks). The full-attention group pulls its 10th block; the
		// window (from token 257) starts in block 8, cached, so the sliding
		// group pulls only its block 9: 2 blocks, group skips [1 9].
		const n1, n2, hit = 300, 320, 288
		d := engineURL(t, c, "decode-0")
		one := idPrompt(904, n1, max)
		if got := pdLegs(ctx, t, prefillURL, d, one); fmt.Sprint(got.ids) != fmt.Sprint(alone(t, one).ids) {
			t.Fatalf("turn 1 differs from vLLM alone")
		}
		two := idPrompt(904, n2, max)
		want := alone(t, two)
		p0, l0, h0 := pulled(), vllmSource(t, d, "external_kv_transfer"), vllmSource(t, d, "local_cache_hit")
		got := pdLegs(ctx, t, prefillURL, d, two)
		if fmt.Sprint(got.ids) != fmt.Sprint(want.ids) {
			t.Fatalf("turn 2 differs from vLLM alone:\n got %v\nwant %v", got.ids, want.ids)
		}
		if h, l := vllmSource(t, d, "local_cache_hit")-h0, vllmSource(t, d, "external_kv_transfer")-l0; h != hit || l != n2-hit {
			t.Fatalf("turn 2: %v tokens from decode-0's cache and %v loaded, want %d and %d", h, l, hit, n2-hit)
		}
		if b := pulled() - p0; b != 2*hybridRegionBlockBytes {
			t.Fatalf("turn 2 pulled %v bytes, want 2 blocks of %d (each group's rest past the hit)", b, hybridRegionBlockBytes)
		}
	})

	t.Run("resume-SIGKILL", func(t *testing.T) {
		const n = 300
		body := idPrompt(903, n, max)
		want := alone(t, body)
		l0 := loadedBy()
		computed := vllmSource(t, prefillURL, "local_compute")
		var victim string
		var faultErr error
		got, err := postStream(ctx, c.RouterURL()+"/v1/completions", body, func(i int, s *streamed) {
			if i == 24 {
				victim = s.header.Get("X-Connex-Decode-Engine")
				faultErr = c.Kill(victim + "/engine")
			}
		})
		if err != nil || faultErr != nil || victim == "" {
			t.Fatalf("stream: %v; fault: %v; decode engine %q", err, faultErr, victim)
		}
		other := map[string]string{"decode-0": "decode-1", "decode-1": "decode-0"}[victim]
		if got.status != 200 || got.dones != 1 || len(got.errors) > 0 || fmt.Sprint(got.ids) != fmt.Sprint(want.ids) {
			t.Fatalf("after SIGKILL of %s: status %d %s, errors %v\n got %v\nwant %v", victim, got.status, got.body, got.errors, got.ids, want.ids)
		}
		if l := vllmSource(t, engineURL(t, c, other), "external_kv_transfer") - l0[other]; l != n {
			t.Fatalf("%s resumed with %v tokens of KV loaded, want the hold's %d", other, l, n)
		}
		if d := vllmSource(t, prefillURL, "local_compute") - computed; d != n {
			t.Fatalf("the prefill vLLM computed %v prompt tokens, want %d (one prefill)", d, n)
		}
	})

	checkFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if u := vllmMetric(t, prefillURL, "vllm:kv_cache_usage_perc"); u != 0 {
			return fmt.Errorf("the prefill vLLM's KV cache is %.4f used after every request: its held blocks are not back", u)
		}
		return nil
	})
}
