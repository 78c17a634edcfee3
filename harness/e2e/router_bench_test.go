package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// BenchmarkRouter compares the Connex router with vllm-router (make
// bench-router): both in front of the same instant P/D engines (one prefill,
// two decode: instant_engine_test.go), a streamed 16-token completion per
// request, closed-loop clients at concurrency 1, 8 and 32. Each round runs
// every router (and the engines directly, the client doing the prefill and
// decode legs itself) for BENCH_ROUTER_SECONDS (default 3) at each
// concurrency, in an order that rotates per round, so that what else the
// shared machine does falls on all of them alike; BENCH_ROUNDS rounds
// (default 5). Figures are medians over rounds: requests per second, p99
// latency added over the direct path at c=1, and router CPU per request
// (utime+stime of the router's process from /proc, the embedded NATS included
// for Connex). Then every router idles for BENCH_ROUTER_IDLE_S (default 10)
// and its CPU is read again. The Connex router's membership runs the
// BENCH_ROUTER_PRESET cluster preset (default local: make run's, heartbeats
// at 20 Hz). vllm-router is the binary $CONNEX_VLLM_ROUTER (scripts/bench.sh
// installs the version engine/vllm-connector/vllm-cpu's lock pins), with
// --policy round_robin and its default cache_aware; BENCH_ROUTER_PPROF names
// a file for a CPU profile of the Connex router over its windows at
// concurrency BENCH_ROUTER_PPROF_C (default 32), BENCH_ROUTER_PPROF_IDLE one
// for a profile of its idle window (the profiler's cost then counts in the
// idle figure).
func BenchmarkRouter(b *testing.B) {
	vr := os.Getenv("CONNEX_VLLM_ROUTER")
	if vr == "" {
		b.Skip("CONNEX_VLLM_ROUTER (the vllm-router binary) is not set: run make bench-router")
	}
	rounds := envInt("BENCH_ROUNDS", 5)
	window := time.Duration(envInt("BENCH_ROUTER_SECONDS", 3)) * time.Second
	idle := time.Duration(envInt("BENCH_ROUTER_IDLE_S", 10)) * time.Second
	preset := os.Getenv("BENCH_ROUTER_PRESET")
	if preset == "" {
		preset = "local"
	}
	const model = "instant"
	prefill := startInstantEngine(b, model)
	decodes := []*instantEngine{startInstantEngine(b, model), startInstantEngine(b, model)}

	cx, pprofURL := startConnexRouter(b, preset, model, prefill, decodes)
	targets := []*benchTarget{
		{name: "connex", url: cx.httpURL + "/v1/completions", pid: cx.cmd.Process.Pid, pprofURL: pprofURL},
		startVLLMRouter(b, vr, "round_robin", prefill, decodes),
		startVLLMRouter(b, vr, "cache_aware", prefill, decodes),
		{name: "direct", prefillURL: prefill.URL() + "/v1/completions",
			decodeURLs: []string{decodes[0].URL() + "/v1/completions", decodes[1].URL() + "/v1/completions"}},
	}
	levels := []int{1, 8, 32}
	for _, t := range targets {
		if _, err := t.run(8, time.Second); err != nil { // warm up: connections, first-use costs
			b.Fatalf("%s: warm-up: %v", t.name, err)
		}
	}
	profile := os.Getenv("BENCH_ROUTER_PPROF")
	profileAt := envInt("BENCH_ROUTER_PPROF_C", 32)
	var profiles [][]byte
	results := map[string]map[int][]windowResult{}
	b.ResetTimer()
	for r := range rounds {
		for _, c := range levels {
			for i := range targets {
				t := targets[(i+r)%len(targets)]
				var stop func() []byte
				if profile != "" && t.pprofURL != "" && c == profileAt {
					stop = startCPUProfile(b, t.pprofURL, window)
				}
				res, err := t.run(c, window)
				if err != nil {
					b.Fatalf("%s c=%d: %v", t.name, c, err)
				}
				if stop != nil {
					profiles = append(profiles, stop())
				}
				if results[t.name] == nil {
					results[t.name] = map[int][]windowResult{}
				}
				results[t.name][c] = append(results[t.name][c], res)
			}
		}
	}
	b.StopTimer()
	for _, d := range decodes {
		if n := d.noKV.Load(); n > 0 {
			b.Fatalf("%d decode requests reached %s without the prefill's kv_transfer_params: not P/D", n, d.URL())
		}
	}
	if n := prefill.bad.Load() + decodes[0].bad.Load() + decodes[1].bad.Load(); n > 0 {
		b.Fatalf("the engines could not read %d requests", n)
	}
	if len(profiles) > 0 {
		allocs := fetchProfile(pprofURL + "/debug/pprof/allocs")
		if err := errors.Join(os.WriteFile(profile, profiles[len(profiles)/2], 0o644), os.WriteFile(profile+".allocs", allocs, 0o644)); err != nil {
			b.Fatal(err)
		}
		fmt.Printf("router: a CPU profile of the Connex router at c=%d (%s) is in %s, its allocations since it started in %s.allocs (go tool pprof -top %s)\n",
			profileAt, window, profile, profile, profile)
	}
	idleCPU := map[string]float64{}
	var before []time.Duration
	for _, t := range targets {
		before = append(before, t.cpu())
	}
	var stopIdle func() []byte
	idleProfile := os.Getenv("BENCH_ROUTER_PPROF_IDLE")
	if idleProfile != "" && pprofURL != "" {
		stopIdle = startCPUProfile(b, pprofURL, idle)
	}
	time.Sleep(idle) // what an idle router costs is the measurement: nothing to wait for
	if stopIdle != nil {
		if err := os.WriteFile(idleProfile, stopIdle(), 0o644); err != nil {
			b.Fatal(err)
		}
		fmt.Printf("router: a CPU profile of the idle Connex router (%s, the profiler's own cost in the idle figure) is in %s\n", idle, idleProfile)
	}
	for i, t := range targets {
		if t.pid != 0 {
			idleCPU[t.name] = 100 * float64(t.cpu()-before[i]) / float64(idle)
		}
	}

	med := func(name string, c int, f func(windowResult) float64) float64 {
		var v []float64
		for _, w := range results[name][c] {
			v = append(v, f(w))
		}
		return median(v)
	}
	rps := func(w windowResult) float64 { return w.rps() }
	p50 := func(w windowResult) float64 { return w.quantile(0.5) }
	p99 := func(w windowResult) float64 { return w.quantile(0.99) }
	fmt.Printf("router bench: %d rounds × %s windows, preset %s, %d-token streams, engines 1 prefill + 2 decode (instant)\n",
		rounds, window, preset, instantTokens)
	for _, c := range levels {
		for _, t := range targets {
			fmt.Printf("  c=%-2d %-12s rps=%7.0f p50=%6.2fms p99=%6.2fms cpu/req=%6.0fµs errors=%d\n", c, t.name,
				med(t.name, c, rps), med(t.name, c, p50), med(t.name, c, p99), t.cpuPerReq(results[t.name][c]), errorsOf(results[t.name][c]))
		}
	}
	for _, t := range targets {
		if t.pid != 0 {
			fmt.Printf("  idle %-12s %.2f%% of a core over %s, peak RSS %s\n", t.name, idleCPU[t.name], idle, peakRSS(t.pid))
		}
	}
	added := func(name string) float64 { return med(name, 1, p99) - med("direct", 1, p99) }
	cpuAll := func(name string) float64 {
		var all []windowResult
		for _, c := range levels {
			all = append(all, results[name][c]...)
		}
		return targets[slices.IndexFunc(targets, func(t *benchTarget) bool { return t.name == name })].cpuPerReq(all)
	}
	errs := 0
	for _, c := range levels {
		errs += errorsOf(results["connex"][c])
	}
	// p99 added over the direct path: on a loaded machine the direct path's
	// own p99 can exceed a router's, and a ratio of such differences says
	// nothing.
	addedRatio := "n/a"
	if a, r := added("connex"), added("round_robin"); r > 0 && a >= 0 {
		addedRatio = fmt.Sprintf("%.2f", a/r)
	}
	fmt.Printf("ROUTER rps_vs_round_robin_c8=%.2f rps_vs_round_robin_c32=%.2f p99_added_vs_round_robin_c1=%s cpu_per_req_vs_round_robin=%.2f"+
		" idle_cpu_pct=%.2f rps_vs_round_robin_c1=%.2f rps_vs_cache_aware_c8=%.2f rps_vs_cache_aware_c32=%.2f p99_added_ms=%.2f rr_p99_added_ms=%.2f"+
		" cpu_per_req_us=%.0f rr_cpu_per_req_us=%.0f errors=%d\n",
		med("connex", 8, rps)/med("round_robin", 8, rps), med("connex", 32, rps)/med("round_robin", 32, rps),
		addedRatio, cpuAll("connex")/cpuAll("round_robin"),
		idleCPU["connex"], med("connex", 1, rps)/med("round_robin", 1, rps),
		med("connex", 8, rps)/med("cache_aware", 8, rps), med("connex", 32, rps)/med("cache_aware", 32, rps),
		added("connex"), added("round_robin"), cpuAll("connex"), cpuAll("round_robin"), errs)
}

// startConnexRouter starts a Connex router (connexd --role router, the
// embedded NATS) and a prefill and a decode connexd beside it, registers the
// engines with them as engine shims do, and keeps the registrations alive
// until the benchmark ends.
func startConnexRouter(b *testing.B, preset, model string, prefill *instantEngine, decodes []*instantEngine) (*proc, string) {
	b.Helper()
	args := []string{"--role", "router", "--http-listen", "127.0.0.1:0", "--cluster-preset", preset, "--log-level", "warn"}
	pprofURL := ""
	if os.Getenv("BENCH_ROUTER_PPROF") != "" || os.Getenv("BENCH_ROUTER_PPROF_IDLE") != "" {
		addr := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(b))
		args, pprofURL = append(args, "--pprof-listen", addr), "http://"+addr
	}
	router := startConnexd(b, "router", args...)
	p := startConnexd(b, "p1", "--role", "prefill", "--nats-url", router.natsURL, "--cluster-preset", preset, "--log-level", "warn")
	d := startConnexd(b, "d1", "--role", "decode", "--nats-url", router.natsURL, "--cluster-preset", preset, "--log-level", "warn")
	nc := connect(b, router.natsURL)
	regs := []struct {
		member, id, role string
		e                *instantEngine
	}{{p.member, "prefill-0", "prefill", prefill}, {d.member, "decode-0", "decode", decodes[0]}, {d.member, "decode-1", "decode", decodes[1]}}
	register := func() error {
		var errs []error
		for _, r := range regs {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := (&api.Client{NC: nc, Member: r.member}).RegisterEngine(ctx, &messages.RegisterEngineRequest{TtlMs: 60000,
				Engine: &messages.EngineInfo{EngineId: r.id, Role: r.role, Model: model, BaseUrl: r.e.URL(),
					BlocksTotal: 4096, BlocksFree: 4096, BlockSize: 16, MaxModelLen: 4096}})
			cancel()
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	if err := register(); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // renew as a shim does, at a third of the TTL
		defer wg.Done()
		tick := time.NewTicker(20 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if err := register(); err != nil {
					fmt.Fprintf(os.Stderr, "router bench: renewing the engines' registrations: %v\n", err)
				}
			}
		}
	}()
	b.Cleanup(func() { close(done); wg.Wait() })
	awaitStatus(b, 20*time.Second, router.httpURL+"/ready", http.StatusOK)
	return router, pprofURL
}

// startVLLMRouter starts vllm-router (bin) in vLLM's P/D mode with policy in
// front of the engines; it stops with the benchmark.
func startVLLMRouter(b *testing.B, bin, policy string, prefill *instantEngine, decodes []*instantEngine) *benchTarget {
	b.Helper()
	port, prom := freeTCPPort(b), freeTCPPort(b)
	args := []string{"--vllm-pd-disaggregation", "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--policy", policy,
		"--prometheus-host", "127.0.0.1", "--prometheus-port", strconv.Itoa(prom), "--log-level", "warning",
		"--prefill", prefill.URL()}
	for _, d := range decodes {
		args = append(args, "--decode", d.URL())
	}
	cmd := exec.Command(bin, args...)
	var logs safeBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if b.Failed() {
			b.Logf("vllm-router (%s) log:\n%s", policy, logs.String())
		}
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	awaitStatus(b, 60*time.Second, base+"/health", http.StatusOK)
	return &benchTarget{name: policy, url: base + "/v1/completions", pid: cmd.Process.Pid}
}

// benchTarget is what the load goes through: a router (url, its process
// pid) or, with prefillURL set, the engines directly.
type benchTarget struct {
	name       string
	url        string
	pid        int
	pprofURL   string
	prefillURL string
	decodeURLs []string
	client     *http.Client
	seq        int64
	mu         sync.Mutex
}

// windowResult is one window of load on one target.
type windowResult struct {
	done, errors int
	span         time.Duration
	cpu          time.Duration
	lat          []time.Duration // sorted
}

func (w windowResult) rps() float64 { return float64(w.done) / w.span.Seconds() }

// quantile is the latency quantile q in milliseconds.
func (w windowResult) quantile(q float64) float64 {
	if len(w.lat) == 0 {
		return 0
	}
	return float64(w.lat[min(len(w.lat)-1, int(q*float64(len(w.lat))))]) / float64(time.Millisecond)
}

func errorsOf(ws []windowResult) int {
	n := 0
	for _, w := range ws {
		n += w.errors
	}
	return n
}

// cpuPerReq is the target's CPU per completed request over ws, in µs (0 for
// the direct path, which has no process of its own).
func (t *benchTarget) cpuPerReq(ws []windowResult) float64 {
	var cpu time.Duration
	done := 0
	for _, w := range ws {
		cpu += w.cpu
		done += w.done
	}
	if done == 0 || t.pid == 0 {
		return 0
	}
	return float64(cpu.Microseconds()) / float64(done)
}

// cpu is the CPU time the target's process has used (utime+stime).
func (t *benchTarget) cpu() time.Duration {
	if t.pid == 0 {
		return 0
	}
	d, err := procStatCPU(t.pid)
	if err != nil {
		panic(err) // the router died: the figures would be wrong
	}
	return d
}

// procStatCPU reads utime+stime of process pid from /proc/<pid>/stat (clock
// ticks of 10 ms: Linux's USER_HZ).
func procStatCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, data)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, data)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// peakRSS is process pid's peak resident set (VmHWM), as /proc says it.
func peakRSS(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strings.Join(strings.Fields(v), " ")
		}
	}
	return "?"
}

// run drives the target with c closed-loop clients for d, then waits for the
// requests under way.
func (t *benchTarget) run(c int, d time.Duration) (windowResult, error) {
	if t.client == nil {
		t.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
	}
	var (
		mu  sync.Mutex
		res windowResult
		wg  sync.WaitGroup
		bad error
	)
	cpu0 := t.cpu()
	start := time.Now()
	deadline := start.Add(d)
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			done, failed := 0, 0
			var last error
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if err := t.request(); err != nil {
					failed++
					last = err
					continue
				}
				lat = append(lat, time.Since(t0))
				done++
			}
			mu.Lock()
			res.lat = append(res.lat, lat...)
			res.done += done
			res.errors += failed
			if last != nil && bad == nil {
				bad = last
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.span = time.Since(start)
	res.cpu = t.cpu() - cpu0
	slices.Sort(res.lat)
	if res.done == 0 {
		return res, fmt.Errorf("no request completed: %v", bad)
	}
	if bad != nil {
		fmt.Fprintf(os.Stderr, "router bench: %s c=%d: %d of %d requests failed, last: %v\n", t.name, c, res.errors, res.errors+res.done, bad)
	}
	return res, nil
}

// benchPrompt is the text of every prompt, after a number that makes each
// prompt distinct (cache_aware routes by prefix).
const benchPrompt = "Summarise the following: prefill and decode run on different engines; the router sends " +
	"the prompt to a prefill engine, forwards the KV transfer parameters to a decode engine and streams the tokens back."

// request sends one streamed completion through the target and reads it to
// [DONE], checking that every token arrived.
func (t *benchTarget) request() error {
	t.mu.Lock()
	t.seq++
	n := t.seq
	t.mu.Unlock()
	prompt := strconv.FormatInt(n, 10) + " " + benchPrompt
	body := `{"model":"instant","prompt":` + strconv.Quote(prompt) + `,"max_tokens":16,"stream":true}`
	url := t.url
	if t.prefillURL != "" {
		pre := `{"model":"instant","prompt":` + strconv.Quote(prompt) + `,"max_tokens":1,"stream":false,` +
			`"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}}`
		resp, err := t.client.Post(t.prefillURL, "application/json", strings.NewReader(pre))
		if err != nil {
			return err
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return fmt.Errorf("prefill: %d %v", resp.StatusCode, err)
		}
		var ans struct {
			KV json.RawMessage `json:"kv_transfer_params"`
		}
		if json.Unmarshal(data, &ans) != nil || len(ans.KV) == 0 {
			return errors.New("prefill answered without kv_transfer_params")
		}
		body = strings.TrimSuffix(body, "}") + `,"kv_transfer_params":` + string(ans.KV) + "}"
		url = t.decodeURLs[n%int64(len(t.decodeURLs))]
	}
	resp, err := t.client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("status %d: %s", resp.StatusCode, data)
	}
	sc := bufio.NewScanner(resp.Body)
	tokens, done := 0, false
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			continue
		}
		if bytes.Equal(data, []byte("[DONE]")) {
			done = true
			continue
		}
		if bytes.Contains(data, []byte(`"error"`)) {
			return fmt.Errorf("error event: %s", data)
		}
		if bytes.Contains(data, []byte(`"text":" t`)) {
			tokens++
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if !done || tokens != instantTokens {
		return fmt.Errorf("stream ended with done=%v after %d of %d tokens", done, tokens, instantTokens)
	}
	return nil
}

// startCPUProfile starts a CPU profile of d on the pprof server at base;
// the returned func waits for it and returns the profile.
func startCPUProfile(b *testing.B, base string, d time.Duration) func() []byte {
	ch := make(chan []byte, 1)
	go func() { ch <- fetchProfile(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, int(d.Seconds()))) }()
	return func() []byte { return <-ch }
}

// fetchProfile is the profile at url (nil if it cannot be had: the figures
// do not depend on it).
func fetchProfile(url string) []byte {
	resp, err := http.Get(url)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return data
}
