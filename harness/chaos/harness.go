package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/harness/localcluster"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// Options say how to run a scenario.
type Options struct {
	// Connexd and Sim are the binaries (Sim defaults to connex-sim beside
	// Connexd).
	Connexd, Sim string
	// ConnexdArgs are extra flags for every connexd (experiments, and the
	// harness's own tests planting bugs).
	ConnexdArgs []string
	// Log receives every process's output and the harness's notes; nil
	// discards them.
	Log io.Writer
	// LogLevel is every process's --log-level (default warn).
	LogLevel string
	// Progress, if set, is told how the load goes (the progress bar).
	Progress func(Progress)
}

// Progress is the state of a run while the load goes.
type Progress struct {
	Total, Done, InFlight, Failed, Faults int
}

// ErrSetup means the run could not start or be checked (binaries,
// processes, the reference answers): exit status 2, like a bad scenario.
var ErrSetup = errors.New("chaos: setup failed")

// run is one scenario's execution.
type run struct {
	sc   *Scenario
	opts Options
	dir  string
	c    *localcluster.Cluster
	nats *natsProc
	nc   *nats.Conn // admin connection: notices and status
	log  io.Writer

	t0      time.Time
	proxies map[string]*proxy // node → its link to NATS (partitions)
	fleet   *fleet
	rng     *rand.Rand

	mu      sync.Mutex
	faults  []FaultReport
	down    map[string]time.Duration // prefill node → when its current fault began
	windows []faultWindow
	freed   map[string]int
}

// Run executes the scenario: it starts the cluster (router, engines with
// their connexd, NATS), computes every prompt's uninterrupted answer,
// sends the load through the router while the faults happen, heals what
// the faults left broken, waits for quiescence plus retain_s, and checks
// the invariants. Every process it started is gone when it returns, also
// when ctx ends early.
func Run(ctx context.Context, sc *Scenario, opts Options) (rep *Report, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(sc.Timeout))
	defer cancel()
	if opts.Sim == "" {
		opts.Sim = filepath.Join(filepath.Dir(opts.Connexd), "connex-sim")
	}
	for _, b := range []string{opts.Connexd, opts.Sim} {
		if st, err := os.Stat(b); err != nil || st.IsDir() {
			return nil, fmt.Errorf("%w: binary %s: not found (make build; --connexd names connexd, connex-sim must sit beside it)", ErrSetup, b)
		}
	}
	r := &run{sc: sc, opts: opts, log: opts.Log, proxies: map[string]*proxy{}, fleet: newFleet(sc.Nodes),
		rng: rand.New(rand.NewPCG(uint64(sc.Seed), 0x636861)), down: map[string]time.Duration{}, freed: map[string]int{}}
	if r.log == nil {
		r.log = io.Discard
	}
	r.dir, err = os.MkdirTemp("", "connex-chaos-")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSetup, err)
	}
	defer func() { r.close(); _ = os.RemoveAll(r.dir) }()
	if err := r.start(ctx); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSetup, err)
	}
	started := time.Now()
	ref, err := r.reference(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: the uninterrupted reference answers: %v", ErrSetup, err)
	}
	prefillsBefore := r.routerPrefills(ctx)
	falseBefore := r.routerFalseResumes(ctx)
	burn, err := startBurners(sc.Burn.Procs)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSetup, err)
	}
	defer burn.stop()
	if sc.Burn.Procs > 0 {
		r.note("%d CPU burner(s) running beside the load", sc.Burn.Procs)
	}
	records := r.load(ctx)
	load := loadAvg()
	burn.stop()
	prefillsAfter := r.routerPrefills(ctx)
	r.healAll(ctx)
	ev := Evidence{Records: records, Reference: ref, RouterPrefills: -1, Expect: sc.Expect}
	if prefillsBefore >= 0 && prefillsAfter >= prefillsBefore && !r.faultedRouterOrPrefill() {
		ev.RouterPrefills = prefillsAfter - prefillsBefore
	}
	switch live, err := r.quiesce(ctx); {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		// The scenario's timeout: the report says so, with what was gathered.
		ev.OutOfTime = true
	case err != nil:
		return nil, fmt.Errorf("%w: after the load: %v", ErrSetup, err)
	default:
		ev.Live = live
		ev.DoubleFrees = r.doubleFrees(ctx)
	}
	// A deadline that passed during the reads after quiescence left them
	// short: the run is out of time all the same.
	ev.OutOfTime = ev.OutOfTime || errors.Is(ctx.Err(), context.DeadlineExceeded)
	// Read after quiescence: a given-up leg is judged up to a stall
	// window after its request's resumed stream delivered.
	if falseAfter := r.routerFalseResumes(ctx); falseBefore != nil && falseAfter != nil && !r.faultedRouter() {
		ev.FalseResumes = map[string]int{}
		for reason, n := range falseAfter {
			if d := n - falseBefore[reason]; d > 0 {
				ev.FalseResumes[reason] = d
			}
		}
	}
	r.mu.Lock()
	ev.Freed = maps(r.freed)
	ev.Down = append([]faultWindow(nil), r.windows...)
	faults := append([]FaultReport(nil), r.faults...)
	r.mu.Unlock()
	ev.Faults = faults
	rep = &Report{Scenario: sc.Name, Seed: sc.Seed, Started: started, Duration: time.Since(started), LoadAvg: load,
		Summary: Summarize(ev), Faults: faults, Violations: Check(ev), Records: records}
	return rep, nil
}

func maps(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (r *run) note(format string, args ...any) {
	fmt.Fprintf(r.log, "chaos: "+format+"\n", args...)
}

// needsOwnNATS: NATS restarts and partitions need a server outside the
// router's connexd (partitions put a proxy in front of it).
func (r *run) needsOwnNATS() bool {
	for _, f := range r.sc.Faults {
		if f.Action == ActNATSRestart || f.Action == ActPartition {
			return true
		}
	}
	return false
}

func (r *run) start(ctx context.Context) error {
	o := localcluster.Defaults()
	o.Connexd, o.Sim = r.opts.Connexd, r.opts.Sim
	o.Prefill, o.Decode = r.sc.Nodes.Prefill, r.sc.Nodes.Decode
	o.PrefillPerToken = time.Duration(r.sc.Engine.PrefillUSPerToken) * time.Microsecond
	o.SimArgsFor = func(name string, _ localcluster.Role) []string { return r.sc.Shapes[name].SimArgs() }
	o.DecodePerToken = time.Duration(r.sc.Engine.DecodeMSPerToken * float64(time.Millisecond))
	o.ClusterPreset = "local"
	o.MaxModelLen = r.sc.Load.PromptTokens + r.sc.Load.MaxTokens + 256
	o.Dir = filepath.Join(r.dir, "cluster")
	o.Log = r.log
	if r.opts.LogLevel != "" {
		o.LogLevel = r.opts.LogLevel
	}
	o.ConnexdArgs = append([]string{"--retain-s", strconv.Itoa(r.sc.RetainS), "--kv-load-failure-policy", "recompute", "--metrics-listen", "127.0.0.1:0"}, r.opts.ConnexdArgs...)
	admin := ""
	if r.needsOwnNATS() {
		n, err := startNATSProc(ctx, r.opts.Connexd, filepath.Join(r.dir, "nats"))
		if n != nil {
			r.nats = n // stopped by close, also when its start failed midway
		}
		if err != nil {
			return err
		}
		o.NATSURL, o.AuthDir, admin = n.url, filepath.Join(r.dir, "nats", "auth"), n.admin
		host := strings.TrimPrefix(n.url, "nats://")
		o.NATSURLFor = func(node, url string) string {
			r.mu.Lock()
			defer r.mu.Unlock()
			p, ok := r.proxies[node]
			if !ok {
				var err error
				if p, err = newProxy(host); err != nil {
					return url
				}
				r.proxies[node] = p
			}
			return "nats://" + p.addr()
		}
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return err
	}
	c, err := localcluster.Start(ctx, o)
	if err != nil {
		return err
	}
	r.c = c
	if admin == "" {
		admin = c.AdminCreds()
	}
	copts := []nats.Option{nats.Name("connex-chaos"), nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}
	if admin != "" {
		copts = append(copts, nats.UserCredentials(admin))
	}
	r.nc, err = nats.Connect(c.NATSURL(), copts...)
	if err != nil {
		return fmt.Errorf("connect to NATS as admin: %w", err)
	}
	// Every blocks.freed notice, counted per transfer (exactly-once free).
	_, err = r.nc.Subscribe(api.Prefix+".engine.*.*."+api.KindFreed, func(m *nats.Msg) {
		var f messages.BlocksFreed
		if proto.Unmarshal(m.Data, &f) == nil && f.TransferId != "" {
			r.mu.Lock()
			r.freed[f.TransferId]++
			r.mu.Unlock()
		}
	})
	if err != nil {
		return err
	}
	return r.nc.Flush()
}

func (r *run) close() {
	if r.nc != nil {
		r.nc.Close()
	}
	if r.c != nil {
		if err := r.c.Close(); err != nil {
			r.note("closing the cluster: %v", err)
		}
	}
	for _, p := range r.proxies {
		p.close()
	}
	if r.nats != nil {
		r.nats.close()
	}
}

func (r *run) client() *client {
	timeout := time.Duration(float64(r.sc.Load.MaxTokens)*r.sc.Engine.DecodeMSPerToken*4)*time.Millisecond + 60*time.Second
	return &client{
		http:      &http.Client{Timeout: timeout},
		router:    r.c.RouterURL(),
		model:     "connex-sim",
		maxTokens: r.sc.Load.MaxTokens,
		gapMin:    max(100*time.Millisecond, time.Duration(r.sc.Engine.DecodeMSPerToken*5*float64(time.Millisecond))),
		t0:        time.Now(),
	}
}

// poolSize is how many distinct prompts the load draws from.
func (r *run) poolSize() int { return min(r.sc.Load.Requests, 16) }

// reference asks every prompt of the pool, as a completion and (if the
// load sends chats) as a chat, once before any fault: the answers every
// request must equal.
func (r *run) reference(ctx context.Context) (map[refKey]string, error) {
	cl := r.client()
	kinds := []bool{false}
	if r.sc.Load.Chat > 0 {
		kinds = append(kinds, true)
	}
	out := map[refKey]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, r.poolSize()*len(kinds))
	sem := make(chan struct{}, r.sc.Load.Concurrency)
	for p := range r.poolSize() {
		for _, chat := range kinds {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				rec := cl.do(ctx, request{prompt: p, chat: chat}, promptText(r.sc.Seed, p, r.sc.Load.PromptTokens))
				if !rec.Completed() {
					errs <- fmt.Errorf("prompt %d (chat %v): %s", p, chat, rec.Err)
					return
				}
				mu.Lock()
				out[refKey{p, chat}] = rec.Text
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	return out, nil
}

// load sends the scenario's requests while the faults run.
func (r *run) load(ctx context.Context) []*Record {
	cl := r.client()
	r.t0 = cl.t0
	l := r.sc.Load
	reqs := make([]request, l.Requests)
	rng := rand.New(rand.NewPCG(uint64(r.sc.Seed), 0x6c6f6164))
	for i := range reqs {
		reqs[i] = request{n: i, prompt: rng.IntN(r.poolSize()), stream: rng.Float64() < float64(l.Stream), chat: rng.Float64() < float64(l.Chat)}
	}
	faultsDone := make(chan struct{})
	faultCtx, stopFaults := context.WithCancel(ctx)
	go func() { defer close(faultsDone); r.runFaults(faultCtx) }()

	records := make([]*Record, len(reqs))
	var done, inFlight, failed atomic.Int64
	report := func() {
		if r.opts.Progress != nil {
			r.mu.Lock()
			nf := len(r.faults)
			r.mu.Unlock()
			r.opts.Progress(Progress{Total: len(reqs), Done: int(done.Load()), InFlight: int(inFlight.Load()), Failed: int(failed.Load()), Faults: nf})
		}
	}
	var wg sync.WaitGroup
	next := make(chan request)
	for range l.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for q := range next {
				inFlight.Add(1)
				report()
				rec := cl.do(ctx, q, promptText(r.sc.Seed, q.prompt, l.PromptTokens))
				records[q.n] = rec
				inFlight.Add(-1)
				if !rec.Completed() {
					failed.Add(1)
				}
				done.Add(1)
				report()
			}
		}()
	}
	tick := time.NewTicker(250 * time.Millisecond)
	tickDone := make(chan struct{})
	defer func() { tick.Stop(); close(tickDone) }()
	go func() {
		for {
			select {
			case <-tick.C:
				report()
			case <-tickDone:
				return
			}
		}
	}()
	for _, q := range reqs {
		select {
		case next <- q:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(next)
	wg.Wait()
	// Faults scheduled after the last request still happen (a scenario's
	// timeline is its own), unless the run is out of time.
	<-faultsDone
	stopFaults()
	for i, rec := range records {
		if rec == nil {
			records[i] = &Record{N: i, Prompt: reqs[i].prompt, Chat: reqs[i].chat, Stream: reqs[i].stream, Lost: true, Err: "never sent: the run ran out of time"}
		}
	}
	report()
	return records
}

// quiesce waits until no prefill member holds anything, up to retain_s
// plus a margin, and returns the holds still alive then.
func (r *run) quiesce(ctx context.Context) (map[string]uint32, error) {
	deadline := time.Now().Add(time.Duration(r.sc.RetainS)*time.Second + 15*time.Second)
	for {
		live := map[string]uint32{}
		var errs []string
		for i := range r.sc.Nodes.Prefill {
			member := nodeName("prefill", i)
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			st, err := (&api.Client{NC: r.nc, Member: member}).MemberStatus(cctx, &messages.MemberStatusRequest{})
			cancel()
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", member, err))
				continue
			}
			for _, h := range st.Holds {
				live[h.TransferId] = uint32(len(h.BlockIds))
			}
		}
		if len(live) == 0 && len(errs) == 0 {
			return nil, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			if len(errs) > 0 && len(live) == 0 {
				return nil, errors.New(strings.Join(errs, "; "))
			}
			return live, nil
		}
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}
