package e2e

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
	"github.com/connex/connex/kvmem/regionfile"
)

// BenchmarkResume measures what a decode failure costs a streamed request
// (make bench-resume): the time from the fault to the next token the client
// receives, minus the stream's normal inter-token time, when the router
// resumes the request on another decode engine (one pull of the same hold,
// k tokens recomputed), against re-running prefill (what Dynamo's migration
// and llm-d's fail-over do: the client's tokens so far resent as a new
// request). Llama-3-8B-shaped KV (128 KiB per token), prefill 50 µs per
// prompt token, decode 20 ms per token, fault at token 32; SIGKILL and
// SIGSTOP of the decode engine separately. BENCH_TRIALS sets the trials per
// row (default 10); BENCH_SHM_DIR is every connexd's shm_dir (a huge=always
// tmpfs: scripts/bench.sh mounts one when it runs as root).
func BenchmarkResume(b *testing.B) {
	trials := 10
	if v, err := strconv.Atoi(os.Getenv("BENCH_TRIALS")); err == nil && v > 0 {
		trials = v
	}
	const faultAt, maxTokens = 32, 40
	c := startProduct(b, func(o *localcluster.Options) {
		o.Layout = "llama3-8b"
		// Room for two 8192-token requests: the re-prefill baseline's new
		// prefill must not wait for the abandoned request's hold to end.
		o.Blocks = 2*((8192+maxTokens)/16) + 8
		o.Decode = 3
		o.PrefillPerToken = 50 * time.Microsecond
		o.DecodePerToken = 20 * time.Millisecond
		o.MaxModelLen = 16384
		o.LogLevel = "warn"
		if d := os.Getenv("BENCH_SHM_DIR"); d != "" {
			o.ConnexdArgs = append(o.ConnexdArgs, "--shm-dir", d)
		}
		if l := os.Getenv("BENCH_LOG_LEVEL"); l != "" {
			o.LogLevel, o.Log = l, os.Stderr
		}
	})
	shm := "memfd, 4 KiB pages"
	if d := os.Getenv("BENCH_SHM_DIR"); d != "" {
		pages, err := regionfile.ShmDirPages(d)
		if err != nil {
			b.Fatal(err)
		}
		shm = fmt.Sprintf("shm_dir %s, %s pages", d, pages)
	}
	fmt.Printf("regions: %s\n", shm)
	nc := connect(b, c.NATSURL())
	url := c.RouterURL() + "/v1/completions"
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 11))
	prompt := func(n int) []uint32 {
		p := make([]uint32, n)
		for i := range p {
			p[i] = uint32(rng.IntN(256))
		}
		return p
	}
	body := func(p []uint32, max int) map[string]any {
		return map[string]any{"model": "connex-sim", "prompt": p, "max_tokens": max, "stream": true, "return_token_ids": true}
	}
	settle := func(victim string) {
		checkFor(b, 60*time.Second, 20*time.Millisecond, func() error {
			held, err := prefillHeld(b, nc, c)
			if err != nil || held != 0 {
				return fmt.Errorf("prefill blocks still held: %d (%v)", held, err)
			}
			return nil
		})
		if victim != "" {
			waitEngines(b, c)
		}
	}
	// itl is the stream's median inter-token time before the fault.
	itl := func(s *streamed) time.Duration {
		var gaps []time.Duration
		for i := 2; i < faultAt && i < len(s.at); i++ {
			gaps = append(gaps, s.at[i].Sub(s.at[i-1]))
		}
		slices.Sort(gaps)
		return gaps[len(gaps)/2]
	}
	type row struct {
		name string
		gaps []time.Duration
		itl  []time.Duration
		// falseResumes is how many of the row's resumes the router counted
		// false (connex_router_false_resumes_total): its old leg showed
		// life after being given up.
		falseResumes int
	}
	falseResumes := func() int {
		return int(sum(must2(scrapeAs(c.RouterURL()+"/metrics", c.AdminKey())), "connex_router_false_resumes_total"))
	}
	var rows []*row
	run := func(name string, n int, mode string) *row {
		r := &row{name: name}
		before := falseResumes()
		defer func() { r.falseResumes = falseResumes() - before }()
		for trial := 0; trial < trials; trial++ {
			p := prompt(n)
			ref, err := postStream(ctx, url, body(p, maxTokens), nil)
			if err != nil || ref.status != 200 || len(ref.ids) != maxTokens {
				b.Fatalf("%s: reference run: %v %d %s", name, err, ref.status, ref.body)
			}
			settle("")
			var victim string
			var fault time.Time
			var faultErr error
			sctx, cancel := context.WithCancel(ctx)
			got, err := postStream(sctx, url, body(p, maxTokens), func(i int, s *streamed) {
				if i != faultAt {
					return
				}
				victim = s.header.Get("X-Connex-Decode-Engine")
				// Signal without waiting for the process to go (a process
				// with a GiB mapped takes a while to exit): the reader must
				// be back reading before the next token is due.
				pid, err := c.PID(victim + "/engine")
				if err != nil {
					faultErr = err
					return
				}
				fault = time.Now()
				switch mode {
				case "kill", "reprefill":
					faultErr = syscall.Kill(pid, syscall.SIGKILL)
				case "stop":
					faultErr = syscall.Kill(pid, syscall.SIGSTOP)
				}
				if mode == "reprefill" {
					cancel() // the client gives up on this stream and resends
				}
				if os.Getenv("BENCH_LOG_LEVEL") != "" {
					fmt.Fprintf(os.Stderr, "bench: %s fault on %s at %s\n", name, victim, fault.UTC().Format("15:04:05.000000"))
				}
			})
			cancel()
			if faultErr != nil || victim == "" {
				b.Fatalf("%s: fault on %q: %v", name, victim, faultErr)
			}
			var gap time.Duration
			normal := itl(got)
			if mode == "reprefill" {
				again := append(append([]uint32(nil), p...), got.ids[:faultAt]...)
				rest, err := postStream(ctx, url, body(again, maxTokens-faultAt), nil)
				if err != nil || rest.status != 200 || len(rest.at) == 0 {
					b.Fatalf("%s: resend: %v %d %s", name, err, rest.status, rest.body)
				}
				gap = rest.at[0].Sub(fault) - normal
				if fmt.Sprint(append(got.ids[:faultAt:faultAt], rest.ids...)) != fmt.Sprint(ref.ids) {
					b.Fatalf("%s: the resent request's tokens differ from the uninterrupted ones", name)
				}
			} else {
				if err != nil || got.status != 200 || fmt.Sprint(got.ids) != fmt.Sprint(ref.ids) || got.dones != 1 {
					b.Fatalf("%s: the resumed stream differs: %v status %d errors %v\n got %v\nwant %v", name, err, got.status, got.errors, got.ids, ref.ids)
				}
				gap = got.at[faultAt].Sub(fault) - normal
			}
			r.gaps = append(r.gaps, gap)
			r.itl = append(r.itl, normal)
			rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
			if mode != "stop" {
				_ = c.Kill(victim + "/engine") // reap it
			}
			if mode == "stop" {
				err = c.Cont(victim + "/engine")
			} else {
				err = c.Restart(rctx, victim+"/engine")
			}
			rcancel()
			if err != nil {
				b.Fatalf("%s: restore %s: %v", name, victim, err)
			}
			settle(victim)
		}
		rows = append(rows, r)
		return r
	}
	// pct is the nearest-rank percentile: p99 of 10 trials is the largest.
	pct := func(ds []time.Duration, p float64) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return float64(s[max(i, 0)].Microseconds()) / 1000
	}
	// Warm-up: every decode engine loads a hold of the size a row measures
	// once, so the timed pulls do not pay first-touch page faults of fresh
	// shared memory (about 0.4 s per GiB here, once per region and reader
	// mapping).
	warm := func(n int) {
		for _, e := range c.Engines() {
			if e.Role != localcluster.RoleDecode {
				continue
			}
			var pre string
			for _, p := range c.Engines() {
				if p.Role == localcluster.RolePrefill {
					pre = p.URL
				}
			}
			p := prompt(n)
			_, ans, err := postJSON(ctx, pre+"/v1/completions", map[string]any{"model": "connex-sim", "prompt": p, "max_tokens": 1,
				"kv_transfer_params": map[string]any{"do_remote_decode": true}})
			if err != nil || ans["kv_transfer_params"] == nil {
				b.Fatalf("warm-up prefill on %s: %v %v", pre, err, ans)
			}
			kv := ans["kv_transfer_params"].(map[string]any)
			kv["connex_request_id"] = fmt.Sprintf("warmup-%s-%d", e.Name, rng.Uint64())
			status, _, err := postJSON(ctx, e.URL+"/v1/completions", map[string]any{"model": "connex-sim", "prompt": p, "max_tokens": 1, "kv_transfer_params": kv})
			if err != nil || status != 200 {
				b.Fatalf("warm-up decode on %s: %d %v", e.Name, status, err)
			}
		}
		settle("")
	}
	b.ResetTimer()
	// BENCH_ROWS (e.g. "kill 8192") limits the run to some rows, for
	// looking into one; the RESUME line needs them all.
	only := os.Getenv("BENCH_ROWS")
	measure := func(name string, n int, mode string) *row {
		if only != "" && !strings.Contains(only, name) {
			return nil
		}
		warm(n)
		return run(name, n, mode)
	}
	kill1k := measure("kill 1024", 1024, "kill")
	hang1k := measure("hang 1024", 1024, "stop")
	kill8k := measure("kill 8192", 8192, "kill")
	measure("hang 8192", 8192, "stop")
	measure("reprefill 1024", 1024, "reprefill")
	re8k := measure("reprefill 8192", 8192, "reprefill")
	b.StopTimer()
	fmt.Printf("\n%-16s %7s %9s %9s %9s %9s %7s\n", "case", "trials", "gap p50", "gap p99", "gap max", "itl p50", "false")
	for _, r := range rows {
		fmt.Printf("%-16s %7d %7.1fms %7.1fms %7.1fms %7.1fms %7d\n", r.name, len(r.gaps), pct(r.gaps, 0.5), pct(r.gaps, 0.99), pct(r.gaps, 1), pct(r.itl, 0.5), r.falseResumes)
	}
	fmt.Println("\ngaps in trial order (ms):")
	for _, r := range rows {
		fmt.Printf("%-16s", r.name)
		for _, g := range r.gaps {
			fmt.Printf(" %.1f", float64(g.Microseconds())/1000)
		}
		fmt.Println()
	}
	if kill1k == nil || hang1k == nil || kill8k == nil || re8k == nil {
		return
	}
	resumed, falsely := 0, 0
	for _, r := range rows {
		if !strings.HasPrefix(r.name, "reprefill") {
			resumed += len(r.gaps)
			falsely += r.falseResumes
		}
	}
	fmt.Printf("RESUME kill_gap_p99_ms_1k=%.1f kill_gap_p99_ms_8k=%.1f hang_gap_p99_ms_1k=%.1f vs_reprefill_8k=%.3f false_resumes=%d/%d\n",
		pct(kill1k.gaps, 0.99), pct(kill8k.gaps, 0.99), pct(hang1k.gaps, 0.99), pct(kill8k.gaps, 0.5)/pct(re8k.gaps, 0.5), falsely, resumed)
}
