// Package chaos is Connex's chaos-test harness: it starts a real
// multi-process cluster on one machine (a NATS server, a prefill connexd and
// several decode connexd processes), plays deterministic engines, drives
// requests through the whole hold → pull → decode → finish path, kills
// (SIGKILL) and freezes (SIGSTOP) decode members while requests run, and
// checks the product's invariants:
//
//  1. nothing lost: every request ends with a complete answer or a clear error;
//  2. no second prefill: a resumed request pulls the same hold again;
//  3. same answer: a resumed request's tokens equal the uninterrupted ones;
//  4. no leaked blocks: after the load, every prefill block is free again;
//  5. exactly-once free: no block is handed back twice.
//
// Operators run it (cmd/connex-chaos) to gain trust before production; the
// tests run a short version.
package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// Config says what to run.
type Config struct {
	Binary      string        // connexd binary
	Backend     string        // data plane for every member: tcp or ucx
	Regions     string        // engines' KV regions: RegionsCreate (default) or RegionsFile
	Decoders    int           // decode members kept alive (≥ 2)
	Requests    int           // requests to drive
	Concurrency int           // requests in flight at once
	Tokens      int           // tokens generated per request
	Every       int           // tokens per progress report (checkpoint)
	TokenTime   time.Duration // simulated decode time per token
	Chaos       time.Duration // interval between two faults; 0 disables faults
	Seed        int64         // for faults and request content
	Dir         string        // for region files and data dirs ("" = a temp dir under /dev/shm or TMPDIR)
	Log         io.Writer     // progress lines; nil discards
}

// How engines get their KV regions (Config.Regions).
const (
	// RegionsCreate: each engine's member allocates it (region.create);
	// with UCX, pulls from it are one-sided mapped reads.
	RegionsCreate = "create"
	// RegionsFile: each engine creates a /dev/shm file and registers it
	// (region.register).
	RegionsFile = "file"
)

// DefaultConfig is a short run: 3 decode members, 48 requests of 64
// tokens at 5 ms a token, a fault every 1.5 s.
func DefaultConfig() Config {
	return Config{Backend: "tcp", Regions: RegionsCreate, Decoders: 3, Requests: 48, Concurrency: 6, Tokens: 64, Every: 8, TokenTime: 5 * time.Millisecond, Chaos: 1500 * time.Millisecond, Seed: 1}
}

// layout of every engine region: small enough for many processes on one box.
var layout = kvmem.Layout{Layers: 4, Planes: 2, Blocks: 256, BlockBytes: 4096, BlockSize: 16, TPSize: 1}

// Report is what a run found.
type Report struct {
	Requests   int      // started
	Completed  int      // finished with the expected answer
	Failed     int      // ended with a clear error
	Resumed    int      // resumes observed (request moved to another member)
	Kills      int      // SIGKILLs sent
	Stops      int      // SIGSTOPs sent
	Prefills   int      // holds created (one per request when invariant 2 holds)
	Violations []string // broken invariants; empty means the run passed
}

// OK reports whether every invariant held.
func (r Report) OK() bool { return len(r.Violations) == 0 }

func (r Report) String() string {
	s := fmt.Sprintf("requests=%d completed=%d failed=%d resumed=%d kills=%d stops=%d prefills=%d violations=%d",
		r.Requests, r.Completed, r.Failed, r.Resumed, r.Kills, r.Stops, r.Prefills, len(r.Violations))
	for _, v := range r.Violations {
		s += "\n  VIOLATION: " + v
	}
	return s
}

type member struct {
	name    string
	cmd     *exec.Cmd
	eng     *engine
	exited  chan struct{}
	stopped bool // SIGSTOPped and not yet continued
	dead    bool
}

type harness struct {
	cfg     Config
	log     func(string, ...any)
	dir     string
	url     string
	nc      *nats.Conn
	prefill *member
	rng     *rand.Rand

	mu      sync.Mutex
	members map[string]*member // decode members by name
	next    int
	report  Report

	// notice dispatch
	nmu       sync.Mutex
	pullDone  map[string]chan *messages.PullDone
	resumes   map[string]chan *messages.RequestState
	freed     map[string]int      // transfer -> freed notices
	heldBy    map[string][]uint32 // transfer -> prefill blocks
	violation func(string, ...any)
}

// Run starts the cluster, drives the load with faults, stops everything
// and returns what it found. An error means the harness itself could not
// run (a broken invariant is a Violation, not an error).
func Run(ctx context.Context, cfg Config) (rep Report, err error) {
	if cfg.Decoders < 2 || cfg.Requests < 1 || cfg.Concurrency < 1 || cfg.Tokens < 1 || cfg.Every < 1 {
		return rep, errors.New("chaos: need decoders ≥ 2 and positive requests, concurrency, tokens, every")
	}
	switch cfg.Regions {
	case "":
		cfg.Regions = RegionsCreate
	case RegionsCreate, RegionsFile:
	default:
		return rep, fmt.Errorf("chaos: regions=%q, allowed: %s, %s", cfg.Regions, RegionsCreate, RegionsFile)
	}
	h := &harness{cfg: cfg, rng: rand.New(rand.NewSource(cfg.Seed)), members: map[string]*member{},
		pullDone: map[string]chan *messages.PullDone{}, resumes: map[string]chan *messages.RequestState{},
		freed: map[string]int{}, heldBy: map[string][]uint32{}}
	h.log = func(f string, a ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, time.Now().Format("15:04:05.000 ")+f+"\n", a...)
		}
	}
	h.violation = func(f string, a ...any) {
		h.mu.Lock()
		h.report.Violations = append(h.report.Violations, fmt.Sprintf(f, a...))
		h.mu.Unlock()
		h.log("VIOLATION: "+f, a...)
	}
	if h.dir = cfg.Dir; h.dir == "" {
		base := os.TempDir()
		if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
			base = "/dev/shm"
		}
		if h.dir, err = os.MkdirTemp(base, "connex-chaos-"); err != nil {
			return rep, err
		}
		defer os.RemoveAll(h.dir)
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: h.dir + "/nats", NoSigs: true, NoLog: true})
	if err != nil {
		return rep, err
	}
	go srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		return rep, errors.New("chaos: nats-server not ready")
	}
	h.url = srv.ClientURL()
	if h.nc, err = nats.Connect(h.url); err != nil {
		return rep, err
	}
	defer h.nc.Close()
	defer h.stopAll()
	if err := h.subscribe(); err != nil {
		return rep, err
	}
	if h.prefill, err = h.start(ctx, "prefill", "prefill", "engP"); err != nil {
		return rep, err
	}
	for i := 0; i < cfg.Decoders; i++ {
		if _, err := h.addDecoder(ctx); err != nil {
			return rep, err
		}
	}
	if err := h.waitMembers(ctx, cfg.Decoders+1); err != nil {
		return rep, err
	}

	faultsDone := make(chan struct{})
	loadCtx, stopFaults := context.WithCancel(ctx)
	go func() { defer close(faultsDone); h.faults(loadCtx) }()

	sem := make(chan struct{}, cfg.Concurrency)
	var wg sync.WaitGroup
	for i := 0; i < cfg.Requests; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			h.request(ctx, i)
		}(i)
	}
	wg.Wait()
	stopFaults()
	<-faultsDone
	h.checkLeaks(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.report, nil
}

func (h *harness) start(ctx context.Context, name, role, engineID string) (*member, error) {
	args := []string{"--member-id", name, "--role", role, "--backend", h.cfg.Backend, "--nats-url", h.url,
		"--cluster-preset", "local", "--orphan-scan-ms", "200", "--retain-s", "5", "--pull-timeout-ms", "10000",
		"--data-dir", h.dir + "/" + name, "--log-level", "warn", "--region-dir", h.dir}
	cmd := exec.Command(h.cfg.Binary, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	// connexd's stderr goes to our log (or nowhere), never straight to our
	// own stderr: a child must not hold the caller's pipes open.
	errOut, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("chaos: start %s: %w", name, err)
	}
	go func() {
		sc := bufio.NewScanner(errOut)
		for sc.Scan() {
			h.log("[%s] %s", name, sc.Text())
		}
	}()
	m := &member{name: name, cmd: cmd, exited: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "connexd ready") {
				once.Do(func() { close(ready) })
			}
		}
		_ = cmd.Wait()
		close(m.exited)
	}()
	kill := func() { _ = cmd.Process.Kill(); <-m.exited }
	select {
	case <-ready:
	case <-m.exited:
		return nil, fmt.Errorf("chaos: %s exited before ready", name)
	case <-time.After(30 * time.Second):
		kill()
		return nil, fmt.Errorf("chaos: %s not ready in 30s", name)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if m.eng, err = newEngine(rctx, h.nc, h.dir, name, engineID, h.cfg.Regions, layout); err != nil {
		kill()
		return nil, err
	}
	return m, nil
}

func (h *harness) addDecoder(ctx context.Context) (*member, error) {
	h.mu.Lock()
	name := fmt.Sprintf("d%d", h.next)
	h.next++
	h.mu.Unlock()
	m, err := h.start(ctx, name, "decode", "eng-"+name)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.members[name] = m
	h.mu.Unlock()
	h.log("member %s up", name)
	return m, nil
}

func (h *harness) stopAll() {
	h.mu.Lock()
	var all []*member
	for _, m := range h.members {
		all = append(all, m)
	}
	all = append(all, h.prefill) // last: decode members release into it
	h.mu.Unlock()
	for _, m := range all {
		if m == nil {
			continue
		}
		_ = m.cmd.Process.Signal(syscall.SIGCONT)
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.exited:
		case <-time.After(10 * time.Second):
			_ = m.cmd.Process.Kill()
			<-m.exited
		}
		if m.eng != nil {
			m.eng.close()
		}
	}
}

// live lists decode members that are neither dead nor frozen.
func (h *harness) live() []*member {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*member
	for _, m := range h.members {
		if !m.dead && !m.stopped {
			out = append(out, m)
		}
	}
	return out
}

// faults kills or freezes a random live decode member every cfg.Chaos,
// keeping at least two live; killed members are replaced, frozen ones
// continued after 2 s (they come back as zombies and must be fenced).
func (h *harness) faults(ctx context.Context) {
	if h.cfg.Chaos <= 0 {
		return
	}
	t := time.NewTicker(h.cfg.Chaos)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		live := h.live()
		if len(live) <= 2 {
			continue
		}
		h.mu.Lock()
		victim := live[h.rng.Intn(len(live))]
		kill := h.rng.Intn(2) == 0
		h.mu.Unlock()
		if kill {
			h.log("SIGKILL %s", victim.name)
			_ = victim.cmd.Process.Signal(syscall.SIGKILL)
			h.mu.Lock()
			victim.dead = true
			h.report.Kills++
			h.mu.Unlock()
			if _, err := h.addDecoder(ctx); err != nil {
				h.log("replacement failed: %v", err)
			}
			continue
		}
		h.log("SIGSTOP %s", victim.name)
		_ = victim.cmd.Process.Signal(syscall.SIGSTOP)
		h.mu.Lock()
		victim.stopped = true
		h.report.Stops++
		h.mu.Unlock()
		time.AfterFunc(2*time.Second, func() {
			h.log("SIGCONT %s", victim.name)
			_ = victim.cmd.Process.Signal(syscall.SIGCONT)
			h.mu.Lock()
			victim.stopped = false
			h.mu.Unlock()
		})
	}
}

func (h *harness) subscribe() error {
	subs := []struct {
		subject string
		fn      func(*nats.Msg)
	}{
		{"connex.v1.engine.*.pull.done", func(m *nats.Msg) {
			d := new(messages.PullDone)
			if proto.Unmarshal(m.Data, d) != nil {
				return
			}
			h.nmu.Lock()
			ch := h.pullDone[d.PullId]
			h.nmu.Unlock()
			if ch != nil {
				ch <- d
			}
		}},
		{"connex.v1.engine.*.request.resume", func(m *nats.Msg) {
			n := new(messages.ResumeNotice)
			if proto.Unmarshal(m.Data, n) != nil || n.State == nil {
				return
			}
			h.nmu.Lock()
			ch := h.resumes[n.State.RequestId]
			h.nmu.Unlock()
			if ch != nil {
				select {
				case ch <- n.State:
				default:
				}
			}
		}},
		{api.FreedSubject("engP"), func(m *nats.Msg) {
			f := new(messages.BlocksFreed)
			if proto.Unmarshal(m.Data, f) != nil {
				return
			}
			h.nmu.Lock()
			h.freed[f.TransferId]++
			n := h.freed[f.TransferId]
			blocks := h.heldBy[f.TransferId]
			h.nmu.Unlock()
			if n > 1 {
				h.violation("exactly-once free: transfer %s freed %d times", f.TransferId, n)
				return
			}
			if fmt.Sprint(blocks) != fmt.Sprint(f.BlockIds) {
				h.violation("freed notice for %s lists %v, hold had %v", f.TransferId, f.BlockIds, blocks)
				return
			}
			h.prefill.eng.release(f.BlockIds)
		}},
	}
	for _, s := range subs {
		if _, err := h.nc.Subscribe(s.subject, s.fn); err != nil {
			return err
		}
	}
	return h.nc.Flush()
}

// waitMembers waits until n members announce themselves on the cluster's
// heartbeat subjects, so that faults start on a formed cluster.
func (h *harness) waitMembers(ctx context.Context, n int) error {
	var mu sync.Mutex
	seen := map[string]bool{}
	sub, err := h.nc.Subscribe("connex.cluster.*.events.heartbeat.*", func(m *nats.Msg) {
		mu.Lock()
		seen[m.Subject] = true
		mu.Unlock()
	})
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		got := len(seen)
		mu.Unlock()
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("chaos: %d of %d members heartbeating after 30s", got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
