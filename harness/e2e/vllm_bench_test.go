package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// BenchmarkVLLMResume (make bench-vllm): what a decode death costs a
// streamed request on real vLLM engines, resumed by Connex (the hold pulled
// again, the generated tokens recomputed) against re-prefilled (the client,
// or a Dynamo-style migration, resends prompt + generated tokens: a new
// prefill). The gap is the time from the fault to the next token, less the
// stream's own inter-token time. BENCH_VLLM_MODEL is the model directory
// (make bench-vllm makes the "small" one, whose prefill is long enough to
// see); BENCH_VLLM_PROMPT the prompt length in tokens (default 1800);
// BENCH_TRIALS the trials per row (default 5: a killed vLLM takes about a
// minute to come back). A third row freezes the decode vLLM instead
// (SIGSTOP: its connection stays open and silent), which the router gives
// up by its stall rule. It ends with
// `VLLM resume_gap_p50_ms=<a> reprefill_gap_p50_ms=<b> ratio=<a/b> …
// resume_vs_limit=… after_detection_vs_limit=… stop_gap_p50_ms=…`.
func BenchmarkVLLMResume(b *testing.B) {
	bin, model := os.Getenv("CONNEX_VLLM"), os.Getenv("BENCH_VLLM_MODEL")
	if model == "" {
		model = os.Getenv("CONNEX_VLLM_MODEL")
	}
	if bin == "" || model == "" {
		b.Skip("CONNEX_VLLM and BENCH_VLLM_MODEL (or CONNEX_VLLM_MODEL) are not set: run `make bench-vllm`")
	}
	trials, promptLen := 5, 1800
	if v, err := strconv.Atoi(os.Getenv("BENCH_TRIALS")); err == nil && v > 0 {
		trials = v
	}
	if v, err := strconv.Atoi(os.Getenv("BENCH_VLLM_PROMPT")); err == nil && v > 0 {
		promptLen = v
	}
	const faultAt, maxTokens = 24, 40
	bins := productBinaries(b)
	o := localcluster.Defaults()
	o.Connexd = bins.Connexd
	o.Model = vllmModel
	o.LogLevel = "warn"
	o.Metrics = true // the connexds' pull metrics (the resume's breakdown)
	// The router's line for each resumed leg: when it left after the
	// failure, and the grant's part.
	logs := &safeBuffer{}
	o.Log = logs
	o.RouterArgs = append(o.RouterArgs, "--log-level", "info")
	// BENCH_VLLM_LOGS keeps each vLLM's log there (<name>.log).
	o.VLLM = &localcluster.VLLM{Bin: bin, Model: model, MaxModelLen: promptLen + maxTokens + 128, LogDir: os.Getenv("BENCH_VLLM_LOGS")}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	c, err := localcluster.Start(ctx, o)
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	fmt.Printf("model %s, prompt %d tokens, fault after %d of %d tokens, %d trials a row\n", model, promptLen, faultAt, maxTokens, trials)
	url := c.RouterURL() + "/v1/completions"
	bg := context.Background()
	body := func(p []int, max int) map[string]any {
		return map[string]any{"model": vllmModel, "prompt": p, "max_tokens": max, "stream": true, "temperature": 0,
			"ignore_eos": true, "return_token_ids": true, "stream_options": map[string]any{"include_usage": true}}
	}
	// The resume's parts, from the resumed engine's own counters around a
	// trial: vLLM's time to first token (the leg's arrival to its first
	// token), its prefill time (first scheduled to first token: the
	// forward pass over the recomputed tokens, once the KV is in), and its
	// connexd's pull.
	type counters struct{ ttft, prefill, queue, pull, pullRead, pulls float64 }
	counted := func(engine string) counters {
		m := must2(scrape(engineURL(b, c, engine) + "/metrics"))
		out := counters{ttft: sum(m, "vllm:time_to_first_token_seconds_sum"), prefill: sum(m, "vllm:request_prefill_time_seconds_sum"),
			queue: sum(m, "vllm:request_queue_time_seconds_sum")}
		if u, err := c.ReadyField(engine+"/connexd", "metrics"); err == nil && u != "" {
			cm := must2(scrape(u))
			out.pull, out.pullRead, out.pulls = sum(cm, "connex_pull_duration_seconds_sum"), sum(cm, "connex_pull_read_seconds_sum"), sum(cm, "connex_pull_duration_seconds_count")
		}
		return out
	}
	// rest is gap + ITL - engineTTFT: the failure seen (the killed engine's
	// connection closed), the resumed leg sent (sent: fault to the
	// router's send), vLLM's front end before the engine core has the
	// request, and the first token relayed (front: those last two).
	// start is the resumed engine's request.start round trip (its
	// connector's "taken over" line): the takeover before the pull.
	type breakdown struct{ gap, engineTTFT, queue, start, pull, pullRead, prefill, rest, sent, front time.Duration }
	var parts []breakdown
	var givenUp []time.Duration // stop: the freeze to the router's giving up
	prompt := func(trial int) []int {
		p := make([]int, promptLen)
		for i := range p {
			p[i] = 10 + (i*7919+trial*104729)%2000
		}
		return p
	}
	itl := func(s *streamed) time.Duration {
		var gaps []time.Duration
		for i := 2; i < faultAt && i < len(s.at); i++ {
			gaps = append(gaps, s.at[i].Sub(s.at[i-1]))
		}
		slices.Sort(gaps)
		return gaps[len(gaps)/2]
	}
	prefillURL := engineURL(b, c, "prefill-0")
	settle := func() {
		checkFor(b, 60*time.Second, 100*time.Millisecond, func() error {
			m, err := scrape(prefillURL + "/metrics")
			if err != nil {
				return err
			}
			if u := sum(m, "vllm:kv_cache_usage_perc"); u != 0 {
				return fmt.Errorf("prefill KV cache %.4f used", u)
			}
			return nil
		})
		wctx, wcancel := context.WithTimeout(bg, 3*time.Minute)
		defer wcancel()
		if err := c.WaitEngines(wctx); err != nil {
			b.Fatal(err)
		}
	}
	run := func(mode string) (gaps, itls []time.Duration) {
		// Each row its own prompts: a prompt an engine has cached from an
		// earlier row (a resumed engine keeps what it loaded) would make
		// a re-prefill a prefix hit.
		seed := 100 * slices.Index([]string{"resume", "stop", "reprefill"}, mode)
		for trial := range trials {
			p := prompt(seed + trial)
			ref, err := postStream(bg, url, body(p, maxTokens), nil)
			if err != nil || ref.status != 200 || len(ref.ids) != maxTokens {
				b.Fatalf("%s: reference: %v %d %s", mode, err, ref.status, ref.body)
			}
			settle()
			before := map[string]counters{}
			if mode == "resume" {
				for _, e := range []string{"decode-0", "decode-1"} {
					before[e] = counted(e)
				}
			}
			var victim string
			var fault time.Time
			var faultErr error
			sctx, scancel := context.WithCancel(bg)
			got, err := postStream(sctx, url, body(p, maxTokens), func(i int, s *streamed) {
				if i != faultAt {
					return
				}
				victim = s.header.Get("X-Connex-Decode-Engine")
				pid, err := c.PID(victim + "/engine")
				if err != nil {
					faultErr = err
					return
				}
				fault = time.Now()
				if mode == "stop" {
					faultErr = c.Stop(victim + "/engine") // frozen: its sockets stay open
					return
				}
				if mode == "resume" {
					faultErr = syscall.Kill(-pid, syscall.SIGKILL) // the whole vllm serve
					return
				}
				faultErr = syscall.Kill(-pid, syscall.SIGSTOP)
				scancel() // the client gives up on this stream and resends
			})
			scancel()
			if faultErr != nil || victim == "" {
				b.Fatalf("%s: fault on %q: %v", mode, victim, faultErr)
			}
			normal := itl(got)
			var gap time.Duration
			if mode == "reprefill" {
				again := append(append([]int(nil), p...), toInts(got.ids[:faultAt])...)
				rest, err := postStream(bg, url, body(again, maxTokens-faultAt), nil)
				if err != nil || rest.status != 200 || len(rest.at) == 0 {
					b.Fatalf("resend: %v %d %s", err, rest.status, rest.body)
				}
				gap = rest.at[0].Sub(fault) - normal
				if fmt.Sprint(append(got.ids[:faultAt:faultAt], rest.ids...)) != fmt.Sprint(ref.ids) {
					b.Fatalf("reprefill: the resent request's tokens differ from the uninterrupted ones")
				}
				if err := c.Cont(victim + "/engine"); err != nil {
					b.Fatal(err)
				}
			} else if mode == "stop" {
				if err != nil || got.status != 200 || fmt.Sprint(got.ids) != fmt.Sprint(ref.ids) || got.dones != 1 {
					b.Fatalf("stop: the resumed stream differs: %v status %d errors %v\n got %v\nwant %v", err, got.status, got.errors, got.ids, ref.ids)
				}
				gap = got.at[faultAt].Sub(fault) - normal
				// When the router gave the frozen leg up (its log's time): the
				// stall window the stream's own pace allowed.
				line := lastLine(logs.String(), "", "decode leg failed; resuming on another decode engine")
				if m := regexp.MustCompile(`time=(\S+)`).FindStringSubmatch(line); m != nil {
					if t, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
						givenUp = append(givenUp, t.Sub(fault))
						fmt.Printf("stop      trial %d: given up %.1f ms after the freeze (%s)\n", trial, ms(t.Sub(fault)), regexp.MustCompile(`reason=\S+`).FindString(line))
					}
				}
				if err := c.Cont(victim + "/engine"); err != nil {
					b.Fatal(err)
				}
			} else {
				if err != nil || got.status != 200 || fmt.Sprint(got.ids) != fmt.Sprint(ref.ids) || got.dones != 1 {
					b.Fatalf("resume: the resumed stream differs: %v status %d errors %v\n got %v\nwant %v", err, got.status, got.errors, got.ids, ref.ids)
				}
				gap = got.at[faultAt].Sub(fault) - normal
				if ds, _ := got.connex["decode_engines"].([]any); len(ds) == 2 {
					on, _ := ds[1].(string)
					a, z := before[on], counted(on)
					sec := func(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }
					bd := breakdown{gap: gap, engineTTFT: sec(z.ttft - a.ttft), queue: sec(z.queue - a.queue), prefill: sec(z.prefill - a.prefill),
						pull: sec(z.pull - a.pull), pullRead: sec(z.pullRead - a.pullRead)}
					// What the engine's TTFT does not cover: the failure seen, the
					// grant, the resumed leg sent, its first token relayed.
					bd.rest = gap + normal - bd.engineTTFT
					if z.pulls-a.pulls != 1 {
						b.Logf("resume trial %d: %s's connexd counted %v pulls, want 1", trial, on, z.pulls-a.pulls)
					}
					parts = append(parts, bd)
					// When the router sent the resumed leg (its log's time, this
					// machine's clock): the failure seen and the leg sent, then
					// vLLM's HTTP front end before the request's arrival.
					line := lastLine(logs.String(), "", "resumed leg sent")
					if m := regexp.MustCompile(`time=(\S+)`).FindStringSubmatch(line); m != nil {
						if sent, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
							bd.sent = sent.Sub(fault)
							bd.front = got.at[faultAt].Sub(sent) - bd.engineTTFT
							parts[len(parts)-1] = bd
						}
					}
					// The connector's line is in the engine's log: the cluster's,
					// or its own file under BENCH_VLLM_LOGS.
					engineLog := logs.String()
					if dir := o.VLLM.LogDir; dir != "" {
						if b, err := os.ReadFile(localcluster.EngineLogPath(dir, on)); err == nil {
							engineLog = string(b)
						}
					}
					took := lastLine(engineLog, "", "request.start answered in")
					if m := regexp.MustCompile(`answered in ([0-9.]+) ms`).FindStringSubmatch(took); m != nil {
						if v, err := strconv.ParseFloat(m[1], 64); err == nil {
							bd.start = time.Duration(v * float64(time.Millisecond))
							parts[len(parts)-1] = bd
						}
					}
					fmt.Printf("resume    trial %d: leg sent %.1f ms after the fault; vLLM's front end and the relay %.1f ms; engine ttft %.1f ms (queue %.1f, of which request.start %.1f and pull %.1f [read %.1f]; prefill %.1f)\n",
						trial, ms(bd.sent), ms(bd.front), ms(bd.engineTTFT), ms(bd.queue), ms(bd.start), ms(bd.pull), ms(bd.pullRead), ms(bd.prefill))
				}
				_ = c.Kill(victim + "/engine") // reap it
				rctx, rcancel := context.WithTimeout(bg, 5*time.Minute)
				err := c.Restart(rctx, victim+"/engine")
				rcancel()
				if err != nil {
					b.Fatalf("restart %s: %v", victim, err)
				}
				// A restarted vLLM's first requests pay its warm-up (tens to
				// hundreds of ms a step): sent straight to it, so that the next
				// trial's stream is not given up as stalled for them.
				for range 2 {
					if w, err := postStream(bg, engineURL(b, c, victim)+"/v1/completions", body(prompt(seed + trial)[:64], 8), nil); err != nil || w.status != 200 {
						b.Fatalf("warm %s up: %v", victim, err)
					}
				}
			}
			fmt.Printf("%-9s trial %d: gap %.1f ms (itl %.1f ms, %s)\n", mode, trial, ms(gap), ms(normal), victim)
			gaps, itls = append(gaps, gap), append(itls, normal)
			settle()
		}
		return gaps, itls
	}
	b.ResetTimer()
	resumed, ritl := run("resume")
	stopped, sitl := run("stop")
	reprefilled, pitl := run("reprefill")
	b.StopTimer()
	p50 := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return ms(s[int(math.Ceil(0.5*float64(len(s))))-1])
	}
	fmt.Printf("\n%-10s %7s %9s %9s %9s\n", "case", "trials", "gap p50", "gap max", "itl p50")
	for _, r := range []struct {
		name      string
		gaps, itl []time.Duration
	}{{"resumed", resumed, ritl}, {"frozen", stopped, sitl}, {"reprefill", reprefilled, pitl}} {
		fmt.Printf("%-10s %7d %7.1fms %7.1fms %7.1fms\n", r.name, len(r.gaps), p50(r.gaps), ms(slices.Max(r.gaps)), p50(r.itl))
	}
	a, re := p50(resumed), p50(reprefilled)
	// The limit a resume cannot beat, measured in the same trials: the pull
	// of the hold's bytes and the engine's own forward pass over the
	// recomputed tokens (its prefill time).
	col := func(f func(breakdown) time.Duration) []time.Duration {
		var v []time.Duration
		for _, bd := range parts {
			v = append(v, f(bd))
		}
		return v
	}
	line := fmt.Sprintf("VLLM resume_gap_p50_ms=%.1f reprefill_gap_p50_ms=%.1f ratio=%.3f", a, re, a/re)
	if len(parts) > 0 {
		limit := p50(col(func(bd breakdown) time.Duration { return bd.pull + bd.prefill }))
		line += fmt.Sprintf(" sent_p50_ms=%.1f front_p50_ms=%.1f engine_ttft_p50_ms=%.1f queue_p50_ms=%.1f start_p50_ms=%.1f pull_p50_ms=%.1f prefill_p50_ms=%.1f limit_p50_ms=%.1f resume_vs_limit=%.2f",
			p50(col(func(bd breakdown) time.Duration { return bd.sent })), p50(col(func(bd breakdown) time.Duration { return bd.front })),
			p50(col(func(bd breakdown) time.Duration { return bd.engineTTFT })), p50(col(func(bd breakdown) time.Duration { return bd.queue })),
			p50(col(func(bd breakdown) time.Duration { return bd.start })), p50(col(func(bd breakdown) time.Duration { return bd.pull })), p50(col(func(bd breakdown) time.Duration { return bd.prefill })),
			limit, a/limit)
		// From the router's sight of the failure (a killed engine's
		// connection closes only once the kernel has torn the process
		// down): what Connex and the resumed engine take.
		after := p50(col(func(bd breakdown) time.Duration { return bd.gap - bd.sent }))
		line += fmt.Sprintf(" after_detection_p50_ms=%.1f after_detection_vs_limit=%.2f", after, after/limit)
	}
	// A frozen decode vLLM (SIGSTOP: its connection stays open, it sends
	// nothing): the gap is the router's stall window, then the resume.
	line += fmt.Sprintf(" stop_gap_p50_ms=%.1f", p50(stopped))
	if len(givenUp) > 0 {
		line += fmt.Sprintf(" stop_given_up_p50_ms=%.1f", p50(givenUp))
	}
	fmt.Println(line)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func toInts(ids []uint32) []int {
	out := make([]int, len(ids))
	for i, v := range ids {
		out[i] = int(v)
	}
	return out
}
