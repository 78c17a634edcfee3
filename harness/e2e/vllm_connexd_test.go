package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// The connexd side failing under real vLLM engines: a connexd restarted
// under its engines, and a hold gone with its prefill connexd.

// newRegionLine is what the connector logs once it made a new KV region on
// a restarted connexd (engine/vllm-connector/connex_vllm/worker.py).
const newRegionLine = "has a new KV region on connexd"

// lostRegionLine is what it logs when it notices that connexd lost the
// region (the move follows at the engine's next step).
const lostRegionLine = "KV region: connexd restarted"

// testVLLMConnexdRestart: an engine's connexd dies and comes back while its
// vLLM lives on (issue 33 item 6). The connector sees the new connexd (a new
// notice journal, or unknown_region on a pull), makes a new region there and
// carries the KV over between two steps: a stream decoding on that engine
// goes on with the same tokens; the prefill engine's holds of the dead
// connexd give their blocks back; later requests load KV with one prefill.
func testVLLMConnexdRestart(t *testing.T, c *localcluster.Cluster, logs *safeBuffer) {
	prefillURL := engineURL(t, c, "prefill-0")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const max, faultAt = 160, 24
	// count is how many lines of engine's vLLM in the whole cluster log hold text.
	count := func(engine, text string) int {
		n := 0
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.HasPrefix(l, engine+"/engine") && strings.Contains(l, text) {
				n++
			}
		}
		return n
	}
	restart := func(target string) {
		t.Helper()
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Minute)
		defer rcancel()
		if err := errorsJoin(c.Kill(target), c.Restart(rctx, target)); err != nil {
			t.Fatalf("restart %s: %v", target, err)
		}
	}
	// waitLine polls engine's vLLM log until line shows more often than before.
	waitLine := func(engine, line string, before int) {
		t.Helper()
		checkFor(t, time.Minute, 100*time.Millisecond, func() error {
			if n := count(engine, line); n <= before {
				return fmt.Errorf("%s's vLLM has not logged %q since its connexd restarted", engine, line)
			}
			return nil
		})
	}

	// 1. A stream decoding while its engine's connexd is killed and restarted.
	prompt := vllmPrompt(200, 300)
	ref, err := postStream(ctx, engineURL(t, c, "decode-0")+"/v1/completions", vllmCompletion(prompt, max), nil)
	if err != nil || ref.status != 200 || len(ref.ids) != max {
		t.Fatalf("reference from vLLM alone: %v, status %d %s, %d tokens", err, ref.status, ref.body, len(ref.ids))
	}
	var victim string
	moved, lost := map[string]int{}, map[string]int{}
	got, err := postStream(ctx, c.RouterURL()+"/v1/completions", vllmCompletion(prompt, max), func(n int, s *streamed) {
		if n == faultAt {
			victim = s.header.Get("X-Connex-Decode-Engine")
			moved[victim], lost[victim] = count(victim, newRegionLine), count(victim, lostRegionLine)
			restart(victim + "/connexd")
		}
	})
	if err != nil || victim == "" {
		t.Fatalf("stream: %v (decode engine %q)", err, victim)
	}
	if got.status != 200 || got.dones != 1 || len(got.errors) > 0 {
		t.Fatalf("after %s's connexd restarted: status %d %s, %d [DONE], errors %v", victim, got.status, got.body, got.dones, got.errors)
	}
	if fmt.Sprint(got.ids) != fmt.Sprint(ref.ids) {
		t.Fatalf("the stream differs from vLLM alone after its connexd restarted:\n got %v\nwant %v", got.ids, ref.ids)
	}
	// The worker noticed (its poll sees a new journal); the region moves at
	// the engine's next step (under the stream if it still ran, else at the
	// next request's).
	waitLine(victim, lostRegionLine, lost[victim])
	waitEnginesFor(t, c, time.Minute)

	// 2. The prefill engine's connexd restarts while it is idle: its worker
	// notices and moves at its next step, which the next request's prefill
	// runs, before its hold is created.
	moved["prefill-0"], lost["prefill-0"] = count("prefill-0", newRegionLine), count("prefill-0", lostRegionLine)
	restart("prefill-0/connexd")
	waitLine("prefill-0", lostRegionLine, lost["prefill-0"])
	waitEnginesFor(t, c, time.Minute)
	served := map[string]bool{"prefill-0": true}
	for i := range 2 {
		prompt := vllmPrompt(int64(210+i), 300)
		ref, err := postStream(ctx, engineURL(t, c, "decode-0")+"/v1/completions", vllmCompletion(prompt, 32), nil)
		if err != nil || ref.status != 200 {
			t.Fatalf("reference: %v %d %s", err, ref.status, ref.body)
		}
		promptTokens := float64(ref.usage["prompt_tokens"])
		computed := vllmSource(t, prefillURL, "local_compute")
		loaded, cached := map[string]float64{}, map[string]float64{}
		for _, d := range []string{"decode-0", "decode-1"} {
			loaded[d] = vllmSource(t, engineURL(t, c, d), "external_kv_transfer")
			cached[d] = vllmSource(t, engineURL(t, c, d), "local_cache_hit")
		}
		got, err := postStream(ctx, c.RouterURL()+"/v1/completions", vllmCompletion(prompt, 32), nil)
		if err != nil || got.status != 200 || got.dones != 1 || len(got.errors) > 0 {
			t.Fatalf("request %d after the restarts: %v, status %d %s, errors %v", i, err, got.status, got.body, got.errors)
		}
		if fmt.Sprint(got.ids) != fmt.Sprint(ref.ids) {
			t.Fatalf("request %d after the restarts differs from vLLM alone:\n got %v\nwant %v", i, got.ids, ref.ids)
		}
		if d := vllmSource(t, prefillURL, "local_compute") - computed; d != promptTokens {
			t.Fatalf("request %d: the prefill vLLM computed %v prompt tokens, want %v (one prefill)", i, d, promptTokens)
		}
		dec := got.header.Get("X-Connex-Decode-Engine")
		served[dec] = true
		// From the hold: the prompt past what the decode engine's own
		// prefix cache held (the reference ran on decode-0).
		l := vllmSource(t, engineURL(t, c, dec), "external_kv_transfer") - loaded[dec]
		h := vllmSource(t, engineURL(t, c, dec), "local_cache_hit") - cached[dec]
		if l == 0 || l+h < promptTokens-128 {
			t.Fatalf("request %d: %s loaded %v tokens of KV and had %v cached, want the rest of the prompt's %v from the hold", i, dec, l, h, promptTokens)
		}
	}
	// Each engine whose connexd restarted moved its region exactly once by
	// the time it served a request (the decode victim may also have moved
	// under its stream).
	for engine, before := range moved {
		if n := count(engine, newRegionLine) - before; n > 1 || (served[engine] && n != 1) {
			t.Fatalf("%s's vLLM logged %q %d times since its connexd restarted (served a request since: %v), want once", engine, newRegionLine, n, served[engine])
		}
		t.Logf("%s: %s", engine, lastLine(logs.String(), engine+"/engine", newRegionLine))
	}
	checkFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if u := vllmMetric(t, prefillURL, "vllm:kv_cache_usage_perc"); u != 0 {
			return fmt.Errorf("the prefill vLLM's KV cache is %.4f used after the requests: its blocks are not back", u)
		}
		return nil
	})
}

// lastLine is the last line of prefix's output in log holding text.
func lastLine(log, prefix, text string) string {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], prefix) && strings.Contains(lines[i], text) {
			return lines[i]
		}
	}
	return ""
}

// testVLLMHoldGone: the hold is gone (its prefill connexd killed) when the
// decode engine dies too, so the engine the request resumes on cannot load
// the KV; vLLM's kv_load_failure_policy decides. decode-1 runs with
// recompute: it prefills locally and the answer still equals vLLM alone's.
// decode-0 runs with fail: vLLM fails the request; the stream ends with one
// error event naming it, then [DONE]. The decode engine to fail first is steered by keeping
// the other busy (the router picks the least loaded).
func testVLLMHoldGone(t *testing.T, c *localcluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	const max, faultAt = 120, 16
	policyOf := map[string]string{"decode-0": "fail", "decode-1": "recompute"}
	seen := map[string]bool{}
	// Ties go to the lower engine id, so a round aimed at decode-0 lets
	// the router pick (decode-1 recomputes); one aimed at decode-1 keeps
	// decode-0 busy first (decode-0 fails).
	// Both rounds run. The fail round once ended with [DONE] and no error:
	// the connector reported a failed load by block ids only, which vLLM
	// matches against the request's computed tokens; it now also names the
	// request (get_transfer_results' failed_recving, vLLM 0.32 on).
	// CONNEX_VLLM_FAIL_ROUND=0 skips it.
	rounds := 2
	if os.Getenv("CONNEX_VLLM_FAIL_ROUND") == "0" {
		rounds = 1
	}
	for round := 0; len(seen) < rounds && round < 4; round++ {
		// The victim this round aims at: the one whose resumer has the
		// policy not seen yet (a round that landed elsewhere is made up by
		// the next, whatever the order).
		want := "decode-0" // resumed by decode-1: recompute
		if seen["recompute"] {
			want = "decode-1" // resumed by decode-0: fail
		}
		// The reference runs on the engine that should not be the victim,
		// so that its just-ended request does not tip the router's pick
		// towards the other (the CI once saw decode-1 picked in a round
		// aimed at decode-0 right after a reference run on decode-0).
		refEngine := map[string]string{"decode-0": "decode-1", "decode-1": "decode-0"}[want]
		t.Run(fmt.Sprintf("round-%d", round), func(t *testing.T) {
			prompt := vllmPrompt(int64(100+round), 300)
			ref, err := postStream(ctx, engineURL(t, c, refEngine)+"/v1/completions", vllmCompletion(prompt, max), nil)
			if err != nil {
				t.Fatalf("reference: %v", err)
			}
			if ref.status != 200 || len(ref.ids) != max {
				t.Fatalf("reference: %d %s", ref.status, ref.body)
			}
			bctx, bcancel := context.WithCancel(ctx)
			busy := make(chan struct{})
			if want == "decode-1" {
				// A long request through the router lands on decode-0 and
				// keeps it the busier: the next goes to decode-1.
				go func() {
					defer close(busy)
					var once bool
					_, _ = postStream(bctx, c.RouterURL()+"/v1/completions", vllmCompletion("keep busy", 1500), func(int, *streamed) {
						if !once {
							once = true
							busy <- struct{}{}
						}
					})
				}()
				select {
				case <-busy:
				case <-ctx.Done():
					t.Fatal("the busy request never streamed")
				}
			} else {
				close(busy)
			}
			var victim string
			var faultErr error
			got, err := postStream(ctx, c.RouterURL()+"/v1/completions", vllmCompletion(prompt, max), func(n int, s *streamed) {
				if n == faultAt {
					victim = s.header.Get("X-Connex-Decode-Engine")
					// Both at once: Kill waits for the process to be gone,
					// and a connexd that mapped the prefill engine's KV takes
					// long enough to exit that the 120-token stream once
					// finished on the victim before its own kill came (the
					// fail round saw [DONE] and no resume). The holder's
					// threads stop at the signal, so the resume's pull finds
					// the hold gone either way.
					kills := make(chan error, 2)
					go func() { kills <- c.Kill("prefill-0/connexd") }()
					go func() { kills <- c.Kill(victim + "/engine") }()
					faultErr = errorsJoin(<-kills, <-kills)
				}
			})
			bcancel()
			<-busy
			if victim != "" {
				// Bring back the prefill engine (its connexd and its vLLM) and
				// the victim for what follows, whatever the checks below say.
				defer func() {
					rctx, rcancel := context.WithTimeout(ctx, 6*time.Minute)
					defer rcancel()
					errs := make(chan error, 2)
					go func() { errs <- c.Restart(rctx, "prefill-0") }()
					go func() { errs <- c.Restart(rctx, victim+"/engine") }()
					if err := errorsJoin(<-errs, <-errs); err != nil {
						t.Error(err)
						return
					}
					waitEnginesFor(t, c, 3*time.Minute)
				}()
			}
			if err != nil || faultErr != nil || victim == "" {
				t.Fatalf("stream: %v; fault on %q: %v", err, victim, faultErr)
			}
			resumer := "decode-0"
			if victim == "decode-0" {
				resumer = "decode-1"
			}
			policy := policyOf[resumer]
			seen[policy] = true
			t.Logf("hold gone: %s killed after %d tokens, %s (%s) took over", victim, faultAt, resumer, policy)
			switch policy {
			case "recompute":
				if got.status != 200 || got.dones != 1 || len(got.errors) > 0 || got.text() != ref.text() {
					t.Fatalf("recompute: status %d %s, errors %v\n got %q\nwant %q", got.status, got.body, got.errors, got.text(), ref.text())
				}
				// With the prefill connexd dead there is no KV to load: the right
				// answer can only come from vLLM recomputing the prompt locally.
			case "fail":
				// vLLM's fail policy ends the request as an internal error
				// ("Internal server error" in its stream), not a load error
				// the router could tell apart: the router tries the next
				// decode engine, finds none, and ends the answer with one
				// error naming the engine's error. What matters: one clear
				// error, one [DONE], no text beyond the truth, no hang.
				if got.status != 200 || got.dones != 1 || len(got.errors) != 1 ||
					!strings.Contains(got.errors[0], "resume_failed") || !strings.Contains(got.errors[0], resumer) {
					t.Fatalf("fail: status %d %s, %d [DONE], errors %v: want one resume_failed error naming %s, then [DONE]", got.status, got.body, got.dones, got.errors, resumer)
				}
				if !strings.HasPrefix(ref.text(), got.text()) || len(got.ids) < faultAt {
					t.Fatalf("fail: the answer before the error is not the reference's beginning:\n got %q\nwant a prefix of %q", got.text(), ref.text())
				}
			}
		})
	}
	if len(seen) < rounds {
		t.Fatalf("policies seen on a resume with the hold gone: %v; want %d of fail and recompute", seen, rounds)
	}
}
