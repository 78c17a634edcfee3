package e2e

// The parts of BenchmarkVLLMPeers (vllm_peers_bench_test.go): what it reads
// of vllm bench serve, a stack's counters and where a run's time went, and
// the processes of the NIXL stack.

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// serveResult is what BenchmarkVLLMPeers reads of `vllm bench serve
// --save-result --save-detailed`.
type serveResult struct {
	Completed  int      `json:"completed"`
	Failed     int      `json:"failed"`
	Duration   float64  `json:"duration"`
	ReqPerSec  float64  `json:"request_throughput"`
	OutTokPS   float64  `json:"output_throughput"`
	MeanTTFT   float64  `json:"mean_ttft_ms"`
	MedianTTFT float64  `json:"median_ttft_ms"`
	P99TTFT    float64  `json:"p99_ttft_ms"`
	MedianTPOT float64  `json:"median_tpot_ms"`
	P99TPOT    float64  `json:"p99_tpot_ms"`
	MedianITL  float64  `json:"median_itl_ms"`
	P99ITL     float64  `json:"p99_itl_ms"`
	MedianE2E  float64  `json:"median_e2el_ms"`
	OutputLens []int    `json:"output_lens"`
	Errors     []string `json:"errors"`

	n, outLen int // prompts sent, tokens asked of each
}

func (r serveResult) summary() string {
	return fmt.Sprintf("%d/%d completed in %.1f s: %.2f req/s, %.1f output tok/s, TTFT p50 %.1f ms p99 %.1f ms (mean %.1f), TPOT p50 %.1f ms p99 %.1f ms, ITL p50 %.1f ms p99 %.1f ms, E2E p50 %.0f ms",
		r.Completed, r.n, r.Duration, r.ReqPerSec, r.OutTokPS, r.MedianTTFT, r.P99TTFT, r.MeanTTFT, r.MedianTPOT, r.P99TPOT, r.MedianITL, r.P99ITL, r.MedianE2E)
}

// incomplete counts the requests that did not complete: failed, never
// sent, or streamed short of the tokens asked (--ignore-eos).
func (r serveResult) incomplete() int {
	short := 0
	for _, l := range r.OutputLens {
		if l < r.outLen {
			short++
		}
	}
	return max(short, r.Failed) + max(0, r.n-len(r.OutputLens))
}

// errorKinds is the failed requests' errors, each kind (its last line,
// trimmed) with its count.
func (r serveResult) errorKinds() string {
	counts, kinds := map[string]int{}, []string{}
	for _, e := range r.Errors {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		lines := strings.Split(e, "\n")
		k := strings.TrimSpace(lines[len(lines)-1])
		if len(k) > 160 {
			k = k[:160] + "…"
		}
		if counts[k] == 0 {
			kinds = append(kinds, k)
		}
		counts[k]++
	}
	var out []string
	for _, k := range kinds {
		out = append(out, fmt.Sprintf("%d× %q", counts[k], k))
	}
	return strings.Join(out, "; ")
}

// peerStack is one of BenchmarkVLLMPeers' two P/D stacks.
type peerStack struct {
	name     string
	url      string            // the router's HTTP root
	engines  map[string]string // engine name → its vLLM's HTTP root
	connexds []string          // the connexds' /metrics (Connex only)
	pids     func() []int      // every process of the stack (each vLLM's whole group)
	kill     func(engine string) error
	// freeze stops (SIGSTOP) or resumes (SIGCONT) the stack's vLLM engines
	// and, for vLLM's stack, vllm-router (whose health checks would
	// otherwise fail on frozen engines).
	freeze func(stop bool) error
}

// peerSnap is a stack's counters at one time: each engine's vLLM metrics,
// and "connexd" for the connexds' summed.
type peerSnap map[string]map[string]float64

func (st *peerStack) snapshot(b *testing.B) peerSnap {
	out := peerSnap{}
	for name, url := range st.engines {
		m, err := scrape(url + "/metrics")
		if err != nil {
			continue // a killed engine
		}
		out[name] = m
	}
	for _, u := range st.connexds {
		m, err := scrape(u)
		if err != nil {
			continue
		}
		if out["connexd"] == nil {
			out["connexd"] = map[string]float64{}
		}
		for k, v := range m {
			out["connexd"][k] += v
		}
	}
	return out
}

// minus is s less before, series by series (an engine gone from s: none).
func (s peerSnap) minus(before peerSnap) peerSnap {
	out := peerSnap{}
	for e, m := range s {
		out[e] = map[string]float64{}
		for k, v := range m {
			out[e][k] = v - before[e][k]
		}
	}
	return out
}

func (s peerSnap) get(engine, name string) float64 { return sum(s[engine], name) }

// mean is the mean of histogram name (its _sum over its _count) over engines, in ms.
func (s peerSnap) mean(name string, engines ...string) (ms, count float64) {
	var total float64
	for _, e := range engines {
		total += s.get(e, name+"_sum")
		count += s.get(e, name+"_count")
	}
	if count == 0 {
		return 0, 0
	}
	return total / count * 1000, count
}

// account is where a run's time went by the engines' own counters (means
// over the run): the prefill leg (the whole request on the prefill vLLM:
// queue and prefill), the decode engine's time to first token (its queue,
// of which the KV transfer), its inter-token latency, and the client's mean
// TTFT less the prefill leg and the decode TTFT: the router and the HTTP
// hops, which neither engine counts.
func (s peerSnap) account(r serveResult, stack string) string {
	leg, legs := s.mean("vllm:e2e_request_latency_seconds", "prefill-0")
	pq, _ := s.mean("vllm:request_queue_time_seconds", "prefill-0")
	pp, _ := s.mean("vllm:request_prefill_time_seconds", "prefill-0")
	dttft, dn := s.mean("vllm:time_to_first_token_seconds", "decode-0", "decode-1")
	dq, _ := s.mean("vllm:request_queue_time_seconds", "decode-0", "decode-1")
	itl, _ := s.mean("vllm:inter_token_latency_seconds", "decode-0", "decode-1")
	var xfer, xn, mib float64
	if stack == "nixl" {
		xfer, xn = s.mean("vllm:nixl_xfer_time_seconds", "decode-0", "decode-1")
		mib = (s.get("decode-0", "vllm:nixl_bytes_transferred_sum") + s.get("decode-1", "vllm:nixl_bytes_transferred_sum")) / (1 << 20)
	} else {
		xfer, xn = s.mean("connex_pull_duration_seconds", "connexd")
		mib = s.get("connexd", "connex_pull_bytes_total") / (1 << 20)
	}
	per := 0.0
	if xn > 0 {
		per = mib / xn
	}
	return fmt.Sprintf("engines (means): prefill leg %.1f ms ×%.0f (queue %.1f, prefill %.1f); decode TTFT %.1f ms ×%.0f (queue %.1f; KV transfer %.1f ms ×%.0f, %.2f MiB each); decode ITL %.1f ms; client TTFT mean − prefill leg − decode TTFT = %.1f ms (router, HTTP hops)",
		leg, legs, pq, pp, dttft, dn, dq, xfer, xn, per, itl, r.MeanTTFT-leg-dttft)
}

// peerProcs are the processes BenchmarkVLLMPeers starts itself (vLLM's
// stack), each in a process group of its own, killed with the test process
// (Pdeathsig where the platform has it) and by close.
type peerProcs struct {
	procs []*peerProc
}

type peerProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
}

func (p *peerProcs) start(name, bin string, args, env []string, logPath string) error {
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Linux's Pdeathsig, set by name: this file builds on every platform
	// the package does.
	if fv := reflect.ValueOf(cmd.SysProcAttr).Elem().FieldByName("Pdeathsig"); fv.IsValid() && fv.CanSet() {
		fv.SetInt(int64(syscall.SIGKILL))
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	pp := &peerProc{name: name, cmd: cmd, done: make(chan struct{}), log: f}
	go func() {
		_ = cmd.Wait()
		close(pp.done)
	}()
	p.procs = append(p.procs, pp)
	return nil
}

func (p *peerProcs) find(name string) (*peerProc, error) {
	for _, pp := range p.procs {
		if pp.name == name {
			return pp, nil
		}
	}
	return nil, fmt.Errorf("no process %s", name)
}

// kill SIGKILLs name's whole process group and waits for it.
func (p *peerProcs) kill(name string) error {
	pp, err := p.find(name)
	if err != nil {
		return err
	}
	err = syscall.Kill(-pp.cmd.Process.Pid, syscall.SIGKILL)
	<-pp.done
	if errors.Is(err, syscall.ESRCH) {
		err = nil
	}
	return err
}

// freeze sends SIGSTOP (stop) or SIGCONT to every live group in start
// order, the engines before the router: it never runs a health check
// against a frozen engine but for an instant.
func (p *peerProcs) freeze(stop bool) error {
	sig := syscall.SIGCONT
	if stop {
		sig = syscall.SIGSTOP
	}
	var errs []error
	for _, pp := range p.procs {
		select {
		case <-pp.done:
			continue
		default:
		}
		if err := syscall.Kill(-pp.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("%s %s: %w", sig, pp.name, err))
		}
	}
	return errors.Join(errs...)
}

// pids are the live processes of every group started.
func (p *peerProcs) pids() []int {
	var out []int
	for _, pp := range p.procs {
		select {
		case <-pp.done:
		default:
			out = append(out, processGroup(pp.cmd.Process.Pid)...)
		}
	}
	return out
}

// close stops every group: SIGTERM, SIGKILL after 10 s.
func (p *peerProcs) close() {
	for _, pp := range p.procs {
		_ = syscall.Kill(-pp.cmd.Process.Pid, syscall.SIGCONT)
		_ = syscall.Kill(-pp.cmd.Process.Pid, syscall.SIGTERM)
	}
	for _, pp := range p.procs {
		select {
		case <-pp.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-pp.cmd.Process.Pid, syscall.SIGKILL)
			<-pp.done
		}
		// Whatever the group left behind (vLLM's engine core outlives a
		// killed API server for a moment).
		_ = syscall.Kill(-pp.cmd.Process.Pid, syscall.SIGKILL)
		pp.log.Close()
	}
}

// ucxProtoLines are the tables UCX_PROTO_INFO=y printed in the logs at
// paths for remote memory access (NIXL's reads of the prefill engine's KV:
// which protocol and transport UCX uses for each size), each distinct table
// once, its agent's name dropped.
func ucxProtoLines(paths ...string) []string {
	prefix := regexp.MustCompile(`^\[[0-9.]+\] \[[^]]*\]\s*`)
	agent := regexp.MustCompile(`^\|\s*[0-9a-f-]+\s+`)
	seen, out := map[string]bool{}, []string{}
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var table []string
		flush := func() {
			key := strings.Join(table, "\n")
			if len(table) > 1 && strings.Contains(table[1], "remote memory") && !seen[key] {
				seen[key] = true
				out = append(out, table...)
			}
			table = nil
		}
		for _, l := range strings.Split(string(raw), "\n") {
			l = strings.TrimSpace(prefix.ReplaceAllString(l, ""))
			switch {
			case strings.HasPrefix(l, "|") && strings.Contains(l, " cfg#"):
				flush()
				table = []string{agent.ReplaceAllString(l, "| ")}
			case strings.HasPrefix(l, "|") && table != nil:
				table = append(table, l)
			case table != nil && !strings.HasPrefix(l, "+"):
				flush()
			}
		}
		flush()
	}
	if len(out) == 0 {
		out = append(out, "(none printed)")
	}
	return out
}

// cpuByPID is the CPU time each of pids has run so far.
func cpuByPID(pids []int) map[int]time.Duration {
	out := map[int]time.Duration{}
	for _, pid := range pids {
		out[pid] = cpuTime([]int{pid})
	}
	return out
}

// cpuSince is the CPU the processes of before have run since (those still
// there: a killed engine's share up to its death is not counted).
func cpuSince(before map[int]time.Duration) time.Duration {
	var total time.Duration
	for pid, t := range before {
		if now := cpuTime([]int{pid}); now >= t {
			total += now - t
		}
	}
	return total
}
