package e2e

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// paceRun is one streamed request's pace: as the client saw it (gaps
// between chunks) and as the engine measured it (vLLM's own inter-token
// latency over the request, from its /metrics).
type paceRun struct {
	engine    string
	gaps      []time.Duration
	engineITL time.Duration
	total     time.Duration
	cpu       map[string]time.Duration // CPU time each part of the cluster ran during the request (cpuParts)
}

// cpuOf is the CPU time each of the cluster's processes (a `vllm serve`
// with its engine core) and this client have run so far, by name.
func cpuOf(c *localcluster.Cluster) map[string]time.Duration {
	out := map[string]time.Duration{"client": cpuTime([]int{os.Getpid()})}
	for name, pid := range c.PIDs() {
		pids := []int{pid}
		if strings.HasSuffix(name, "/engine") {
			pids = append(processGroup(pid), pid)
		}
		out[name] = cpuTime(pids)
	}
	return out
}

// cpuPart is the part of BenchmarkVLLMPace's CPU account process name
// belongs to, for a request decode engine served: the router (with its
// embedded NATS), the connexds, the prefill engine, the decode engine that
// served it, the other decode engines, the client.
func cpuPart(name, served string) string {
	switch {
	case name == "client":
		return "client"
	case name == localcluster.RouterName:
		return "router"
	case name == served+"/engine":
		return "decode_engine"
	case strings.HasPrefix(name, "prefill") && strings.HasSuffix(name, "/engine"):
		return "prefill_engine"
	case strings.HasSuffix(name, "/engine"):
		return "other_decode"
	}
	return "connexds"
}

// cpuPartOrder is the order BenchmarkVLLMPace prints cpuParts in.
var cpuPartOrder = []string{"decode_engine", "router", "connexds", "prefill_engine", "other_decode", "client"}

// BenchmarkVLLMPace (make bench-vllm-pace, issue 46): whether a decode vLLM
// runs as fast through Connex as alone. The same greedy streamed
// completions (BENCH_PACE_TOKENS, default 400) go to a decode vLLM through
// the router (prefill, pull, the connector live on the engine) and straight
// to the same engine (no kv_transfer_params: it computes the prompt
// itself), interleaved, BENCH_ROUNDS rounds (default 5), the order swapped
// every round. It prints each request and ends with
// `PACE engine_itl_vs_alone=… client_gap_p99_vs_alone=… max_gap_vs_alone=…`
// (medians of vLLM's own per-request inter-token latency; the p99 and the
// largest of the client's gaps between chunks; through Connex over alone).
// Before it, each part's CPU a request and `SHARE engine_cores_alone=…
// others_extra_cpu_ms_per_request=… extra_wall_ms_per_request=…`: whether the
// engine alone keeps every core busy, and if it does, how the CPU the other
// processes take through Connex compares with the wall time a request gains.
func BenchmarkVLLMPace(b *testing.B) {
	bin, model := os.Getenv("CONNEX_VLLM"), os.Getenv("BENCH_VLLM_MODEL")
	if model == "" {
		model = os.Getenv("CONNEX_VLLM_MODEL")
	}
	if bin == "" || model == "" {
		b.Skip("CONNEX_VLLM and BENCH_VLLM_MODEL (or CONNEX_VLLM_MODEL) are not set: run `make bench-vllm-pace`")
	}
	rounds, tokens := envInt("BENCH_ROUNDS", 5), envInt("BENCH_PACE_TOKENS", 400)
	bins := productBinaries(b)
	o := localcluster.Defaults()
	o.Connexd = bins.Connexd
	o.Model = vllmModel
	o.LogLevel = "warn"
	o.VLLM = &localcluster.VLLM{Bin: bin, Model: model, MaxModelLen: 2048}
	o.VLLM.Connector = map[string]any{}
	// BENCH_PACE_LOGS=dir: each engine's vLLM log in dir/<engine>.log.
	o.VLLM.LogDir = os.Getenv("BENCH_PACE_LOGS")
	if n := envInt("BENCH_PACE_PROGRESS_EVERY", 0); n > 0 {
		// request.progress every n tokens (the connector's default is 8):
		// what the checkpoints cost the engine's step loop.
		o.VLLM.Connector["progress_every"] = n
	}
	if n, ok := envMs(b, "BENCH_PACE_PROGRESS_INTERVAL_MS"); ok {
		// The least time between two checkpoints of a request (the
		// connector's default is 200; 0: one every progress_every tokens).
		o.VLLM.Connector["progress_interval_ms"] = n
	}
	if n, ok := envMs(b, "BENCH_PACE_IDLE_WAIT_MS"); ok {
		// How long an idle prefill engine with holds waits for work per
		// step (the connector's default is 10000; 0: it steps every
		// millisecond, as vLLM makes it, for the whole decode).
		o.VLLM.Connector["idle_wait_ms"] = n
	}
	profile := os.Getenv("BENCH_PACE_PROFILE")
	pprofAddr := ""
	if profile != "" {
		// Where the router's CPU goes: its Go CPU profile over the rounds
		// (the routed requests and the direct ones, which cost it nothing).
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		pprofAddr = ln.Addr().String()
		ln.Close()
		o.RouterArgs = append(o.RouterArgs, "--pprof-listen", pprofAddr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	c, err := localcluster.Start(ctx, o)
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	bg := context.Background()
	engines := []string{"decode-0", "decode-1"}
	if os.Getenv("BENCH_PACE_ISOLATE") == "1" {
		// How much of the gap is CPU shared with Connex's processes: decode-0
		// (its API server and engine core) alone on CPU 1, everything else —
		// router, connexds, NATS, the prefill engine, this client — on CPU 0;
		// decode-1 killed so that every request lands on decode-0.
		if runtime.NumCPU() < 2 {
			b.Skip("BENCH_PACE_ISOLATE needs two CPUs")
		}
		if err := c.Kill("decode-1/engine"); err != nil {
			b.Fatal(err)
		}
		engines = engines[:1]
		checkFor(b, 30*time.Second, 100*time.Millisecond, func() error {
			req, _ := http.NewRequest(http.MethodGet, c.RouterURL()+"/connex/v1/engines", nil)
			req.Header.Set("Authorization", "Bearer "+c.AdminKey())
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || strings.Contains(string(body), `"engine_id":"decode-1"`) {
				return fmt.Errorf("the router still lists decode-1 (%d)", resp.StatusCode)
			}
			return nil
		})
		pinned := map[int]bool{}
		for name, pid := range c.PIDs() {
			cpu := 0
			if name == "decode-0/engine" {
				cpu = 1
			}
			for _, p := range append(processGroup(pid), pid) {
				if !pinned[p] {
					pinned[p] = true
					if err := pinProcess(p, cpu); err != nil {
						b.Logf("%s: %v", name, err)
					}
				}
			}
		}
		if err := pinProcess(os.Getpid(), 0); err != nil {
			b.Fatal(err)
		}
		fmt.Printf("isolated: decode-0's %d processes on CPU 1, %d others on CPU 0\n", len(processGroup(c.PIDs()["decode-0/engine"])), len(pinned)-len(processGroup(c.PIDs()["decode-0/engine"])))
	}
	// itl is engine url's vLLM inter-token latency so far: sum and count.
	itl := func(url string) (float64, float64) {
		m := must2(scrape(url + "/metrics"))
		return sum(m, "vllm:inter_token_latency_seconds_sum"), sum(m, "vllm:inter_token_latency_seconds_count")
	}
	// stream posts body to url and reads the client's gaps; engine is the
	// decode engine that served it, whose vLLM counted before (sum, count)
	// before the request: its ITL over the request is read once vLLM has
	// counted every token (it updates its histograms as outputs are
	// processed).
	// BENCH_PACE_THREADS=1: the engines' CPU by thread over the routed
	// requests (which of an engine's threads Connex's requests keep busy).
	threads := os.Getenv("BENCH_PACE_THREADS") == "1"
	enginePIDs := func() map[string][]int {
		out := map[string][]int{}
		for name, pid := range c.PIDs() {
			if strings.HasSuffix(name, "/engine") {
				out[name] = append(processGroup(pid), pid)
			}
		}
		return out
	}
	threadSum := map[string]time.Duration{} // part/process/thread over the routed requests
	// quiet waits (up to 5 s) until the engines are idle: under 5 ms of CPU
	// in 100 ms. vLLM's worker spins for a second after its last step, and
	// a request must not pay for the one before it on another engine.
	quiet := func() {
		deadline := time.Now().Add(5 * time.Second)
		prev := cpuOf(c)
		for time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			now := cpuOf(c)
			var busy time.Duration
			for name, t := range now {
				if strings.HasSuffix(name, "/engine") && t > prev[name] {
					busy += t - prev[name]
				}
			}
			if busy < 5*time.Millisecond {
				return
			}
			prev = now
		}
	}
	stream := func(url string, body map[string]any, engine func(*streamed) string, before func(string) [2]float64) paceRun {
		quiet()
		var th0 map[string]map[string]time.Duration
		if threads {
			th0 = map[string]map[string]time.Duration{}
			for name, pids := range enginePIDs() {
				th0[name] = threadCPU(pids)
			}
		}
		cpu0 := cpuOf(c)
		got, err := postStream(bg, url, body, nil)
		if err != nil || got.status != 200 || len(got.ids) != tokens {
			b.Fatalf("%s: %v, status %d %s, %d tokens", url, err, got.status, got.body, len(got.ids))
		}
		r := paceRun{engine: engine(got), total: got.at[len(got.at)-1].Sub(got.started), cpu: map[string]time.Duration{}}
		for name, t := range cpuOf(c) {
			if t >= cpu0[name] { // a process killed (BENCH_PACE_ISOLATE) reads 0
				r.cpu[cpuPart(name, r.engine)] += t - cpu0[name]
			}
		}
		if threads && url == c.RouterURL()+"/v1/completions" {
			for name, pids := range enginePIDs() {
				for th, t := range threadCPU(pids) {
					threadSum[cpuPart(name, r.engine)+" "+th] += t - th0[name][th]
				}
			}
		}
		for i := 1; i < len(got.at); i++ {
			r.gaps = append(r.gaps, got.at[i].Sub(got.at[i-1]))
		}
		b0 := before(r.engine)
		var s1, n1 float64
		checkFor(b, 10*time.Second, 20*time.Millisecond, func() error {
			s1, n1 = itl(engineURL(b, c, r.engine))
			if n1-b0[1] < float64(tokens-1) {
				return fmt.Errorf("%s counted %v inter-token latencies, want %d", r.engine, n1-b0[1], tokens-1)
			}
			return nil
		})
		r.engineITL = time.Duration((s1 - b0[0]) / (n1 - b0[1]) * float64(time.Second))
		return r
	}
	counters := func() map[string][2]float64 {
		out := map[string][2]float64{}
		for _, d := range engines {
			s, n := itl(engineURL(b, c, d))
			out[d] = [2]float64{s, n}
		}
		return out
	}
	direct := func(engine string, body map[string]any) paceRun {
		before := counters()
		return stream(engineURL(b, c, engine)+"/v1/completions", body, func(*streamed) string { return engine },
			func(e string) [2]float64 { return before[e] })
	}
	routed := func(body map[string]any) paceRun {
		before := counters()
		return stream(c.RouterURL()+"/v1/completions", body, func(s *streamed) string { return s.header.Get("X-Connex-Decode-Engine") },
			func(e string) [2]float64 { return before[e] })
	}
	var alone, connex []paceRun
	if profile != "" {
		done := profileRouter(b, pprofAddr, profile)
		defer done()
	}
	for round := range rounds {
		body := vllmCompletion(vllmPrompt(int64(700+round), 300), tokens)
		// The router picks the decode engine; the request alone goes to the
		// same one, after it in even rounds, before it in odd ones (on the
		// engine the router picked in the round before).
		if round%2 == 1 {
			alone = append(alone, direct(connex[len(connex)-1].engine, body))
		}
		connex = append(connex, routed(body))
		if round%2 == 0 {
			alone = append(alone, direct(connex[len(connex)-1].engine, body))
		}
		a, x := alone[len(alone)-1], connex[len(connex)-1]
		// Where the longest gap fell: after token k (token 0 → 1 is where a
		// routed stream passes from the prefill leg to the decode leg).
		at := func(g []time.Duration) int { return slices.Index(g, slices.Max(g)) }
		fmt.Printf("round %d: %s alone: engine ITL %.2f ms, client p99 gap %.1f ms, max %.1f ms after token %d, %.2f s | %s through Connex: engine ITL %.2f ms, client p99 gap %.1f ms, max %.1f ms after token %d, %.2f s\n",
			round, a.engine, ms(a.engineITL), ms(pct(a.gaps, 0.99)), ms(slices.Max(a.gaps)), at(a.gaps), a.total.Seconds(),
			x.engine, ms(x.engineITL), ms(pct(x.gaps, 0.99)), ms(slices.Max(x.gaps)), at(x.gaps), x.total.Seconds())
	}
	med := func(rs []paceRun) time.Duration {
		v := make([]time.Duration, len(rs))
		for i, r := range rs {
			v[i] = r.engineITL
		}
		return pct(v, 0.5)
	}
	all := func(rs []paceRun) []time.Duration {
		var v []time.Duration
		for _, r := range rs {
			v = append(v, r.gaps...)
		}
		return v
	}
	// Where the CPU went: each part's CPU time per request, through Connex
	// and alone (what Connex's processes take from the engine's cores).
	cpuLine := func(rs []paceRun) string {
		var f []string
		for _, p := range cpuPartOrder {
			var sum time.Duration
			for _, r := range rs {
				sum += r.cpu[p]
			}
			f = append(f, fmt.Sprintf("%s=%.0f", p, ms(sum/time.Duration(len(rs)))))
		}
		return strings.Join(f, " ")
	}
	fmt.Printf("CPU ms per request through Connex: %s\nCPU ms per request alone:          %s\n", cpuLine(connex), cpuLine(alone))
	// Whether the engine saturates the machine, and if so how the CPU the
	// other processes take through Connex compares with the wall time the
	// request gains: on a machine the engine keeps busy, one for one.
	mean := func(rs []paceRun, f func(paceRun) time.Duration) time.Duration {
		var sum time.Duration
		for _, r := range rs {
			sum += f(r)
		}
		return sum / time.Duration(len(rs))
	}
	others := func(r paceRun) time.Duration {
		var sum time.Duration
		for p, t := range r.cpu {
			if p != "decode_engine" && p != "client" {
				sum += t
			}
		}
		return sum
	}
	wallA, wallX := mean(alone, func(r paceRun) time.Duration { return r.total }), mean(connex, func(r paceRun) time.Duration { return r.total })
	engA := mean(alone, func(r paceRun) time.Duration { return r.cpu["decode_engine"] })
	fmt.Printf("SHARE engine_cores_alone=%.2f cores=%d others_extra_cpu_ms_per_request=%.0f extra_wall_ms_per_request=%.0f\n",
		ratio(engA, wallA), runtime.NumCPU(), ms(mean(connex, others)-mean(alone, others)), ms(wallX-wallA))
	if threads {
		keys := slices.Collect(maps.Keys(threadSum))
		slices.SortFunc(keys, func(a, b string) int { return int(threadSum[b] - threadSum[a]) })
		for _, k := range keys[:min(len(keys), 24)] {
			fmt.Printf("THREAD %-60s %7.1f ms per routed request\n", k, ms(threadSum[k]/time.Duration(len(connex))))
		}
	}
	ga, gx := all(alone), all(connex)
	fmt.Printf("PACE tokens=%d rounds=%d engine_itl_ms_alone=%.3f engine_itl_ms_connex=%.3f engine_itl_vs_alone=%.3f client_gap_p99_ms_alone=%.2f client_gap_p99_ms_connex=%.2f client_gap_p99_vs_alone=%.3f max_gap_ms_alone=%.1f max_gap_ms_connex=%.1f max_gap_vs_alone=%.3f\n",
		tokens, rounds, ms(med(alone)), ms(med(connex)), ratio(med(connex), med(alone)),
		ms(pct(ga, 0.99)), ms(pct(gx, 0.99)), ratio(pct(gx, 0.99), pct(ga, 0.99)),
		ms(slices.Max(ga)), ms(slices.Max(gx)), ratio(slices.Max(gx), slices.Max(ga)))
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// pct is the p-quantile of v (nearest rank), 0 for none.
func pct(v []time.Duration, p float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// profileRouter starts the router's CPU profile (pprof_listen at addr) for
// BENCH_PACE_PROFILE_S seconds (default 40) and returns the func that waits
// for it and writes it to file (go tool pprof reads it).
func profileRouter(b *testing.B, addr, file string) (done func()) {
	b.Helper()
	type result struct {
		data []byte
		err  error
	}
	out := make(chan result, 1)
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, envInt("BENCH_PACE_PROFILE_S", 40))
	go func() {
		resp, err := http.Get(url)
		if err != nil {
			out <- result{err: err}
			return
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("%s: status %d: %s", url, resp.StatusCode, data)
		}
		out <- result{data, err}
	}()
	return func() {
		r := <-out
		if r.err == nil {
			r.err = os.WriteFile(file, r.data, 0o644)
		}
		if r.err != nil {
			b.Fatalf("router profile: %v", r.err)
		}
		fmt.Printf("router CPU profile: %s (go tool pprof -top %s)\n", file, file)
	}
}

// envMs reads a connector setting in milliseconds from name: 0 or more
// (0 means "off" for the settings it sets, so it must not read as unset);
// ok is false when name is unset, and a value that is not such an integer
// fails the bench rather than running it with the default.
func envMs(b *testing.B, name string) (n int, ok bool) {
	v := os.Getenv(name)
	if v == "" {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		b.Fatalf("%s=%q: want milliseconds, 0 or more", name, v)
	}
	return n, true
}
