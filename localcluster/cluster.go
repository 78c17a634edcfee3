package localcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// readyPoll is how often WaitReady asks the router's /ready.
const readyPoll = 50 * time.Millisecond

// Cluster is a running local cluster. Its methods are safe for concurrent
// use, but control operations on the same target should not overlap.
type Cluster struct {
	opts   Options
	dir    string
	ownDir bool
	log    *lineLog

	mu        sync.Mutex
	router    *process
	natsURL   string
	routerURL string
	authDir   string // the router's authority (its embedded NATS has auth on); "" without
	nodes     map[string]*node
	order     []string // node names in start order
	next      map[Role]int
	closed    bool
}

// node is one engine: its connexd and its connex-sim.
type node struct {
	name    string
	role    Role
	connexd *process
	engine  *process
	url     string // the engine's HTTP base URL
}

// Engine describes one engine of the cluster.
type Engine struct {
	Name       string // "decode-1": also its engine id and its connexd's member id
	Role       Role
	URL        string // connex-sim's HTTP base URL, e.g. http://127.0.0.1:41234
	EnginePID  int    // connex-sim
	ConnexdPID int
}

// Start starts the router, then every engine's connexd and connex-sim (the
// engines in parallel), waits for each process's ready line and for the
// router's GET /ready to answer 200 and its engine list to name every
// engine. ctx bounds only the start: the processes run until Close. On
// error it stops whatever it started; the error carries the failing
// process's last output lines.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: o, log: &lineLog{w: o.Log}, nodes: map[string]*node{}, next: map[Role]int{}}
	if o.Dir != "" {
		c.dir = o.Dir
	} else if c.dir, err = os.MkdirTemp("", "connex-local-"); err != nil {
		return nil, fmt.Errorf("localcluster: temp dir: %w", err)
	}
	c.ownDir = o.Dir == ""
	if err := c.start(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	if err := c.startRouter(ctx, c.opts.NATSListen, c.opts.RouterHTTP); err != nil {
		return err
	}
	var names []string
	for range c.opts.Prefill {
		names = append(names, c.newNode(RolePrefill))
	}
	for range c.opts.Decode {
		names = append(names, c.newNode(RoleDecode))
	}
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() { errs[i] = c.startNode(ctx, name, PartBoth) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := c.WaitReady(ctx); err != nil {
		return err
	}
	return c.WaitEngines(ctx)
}

// newNode records the next engine of role and returns its name.
func (c *Cluster) newNode(role Role) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	name := engineName(role, c.next[role])
	c.next[role]++
	c.nodes[name] = &node{name: name, role: role}
	c.order = append(c.order, name)
	return name
}

// startRouter starts the router's connexd and learns its NATS and HTTP URLs.
func (c *Cluster) startRouter(ctx context.Context, natsListen, httpListen string) error {
	dataDir := filepath.Join(c.dir, RouterName)
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("localcluster: router data dir: %w", err)
	}
	args := c.opts.routerArgs(dataDir, natsListen, httpListen)
	if c.opts.NATSURL != "" && c.opts.AuthDir != "" {
		c.mu.Lock()
		c.authDir = c.opts.AuthDir
		c.mu.Unlock()
		flags, err := c.creds("--nats-creds", filepath.Join(dataDir, "member.creds"), "--role", "member", "--member", RouterName)
		if err != nil {
			return err
		}
		args = append(args, flags...)
	}
	p, err := startProcess(RouterName, c.opts.Connexd, args, connexdReady, c.log)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.router = p
	c.mu.Unlock()
	fields, err := p.waitReady(ctx, c.opts.StartTimeout)
	if err != nil {
		return err
	}
	if fields["http"] == "" {
		return fmt.Errorf("localcluster: the router's ready line has no http= field (a connexd without --role router's HTTP front door?); last output:\n%s", p.logs())
	}
	if fields["nats"] == "" {
		return fmt.Errorf("localcluster: the router's ready line has no nats= field; last output:\n%s", p.logs())
	}
	c.mu.Lock()
	c.natsURL, c.routerURL = fields["nats"], fields["http"]
	if c.opts.NATSURL == "" {
		c.authDir = fields["auth"]
	}
	c.mu.Unlock()
	return nil
}

// creds mints the credentials of one identity from the router's authority
// (`connexd auth creds`) into path, and returns the flags that use them; it
// returns none when the router's NATS runs without authentication.
func (c *Cluster) creds(flag, path string, idArgs ...string) ([]string, error) {
	c.mu.Lock()
	dir := c.authDir
	c.mu.Unlock()
	if dir == "" {
		return nil, nil
	}
	args := append([]string{"auth", "creds", "--dir", dir, "-o", path}, idArgs...)
	if out, err := exec.Command(c.opts.Connexd, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("localcluster: connexd %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return []string{flag, path}, nil
}

// AdminCreds is the admin credentials file of the router's embedded NATS
// (for `connexd status --creds`, `nats --creds`), or "" without auth.
func (c *Cluster) AdminCreds() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.authDir == "" {
		return ""
	}
	return filepath.Join(c.authDir, "admin.creds")
}

// startNode starts part of engine name (PartBoth: connexd, then engine).
func (c *Cluster) startNode(ctx context.Context, name string, part Part) error {
	c.mu.Lock()
	n, natsURL := c.nodes[name], c.natsURL
	c.mu.Unlock()
	if c.opts.NATSURLFor != nil {
		natsURL = c.opts.NATSURLFor(name, natsURL)
	}
	if part == PartBoth || part == PartConnexd {
		dataDir := filepath.Join(c.dir, name)
		if err := os.MkdirAll(dataDir, 0o755); err != nil {
			return fmt.Errorf("localcluster: %s data dir: %w", name, err)
		}
		args := c.opts.engineConnexdArgs(name, n.role, natsURL, dataDir)
		flags, err := c.creds("--nats-creds", filepath.Join(dataDir, "member.creds"), "--role", "member", "--member", name)
		if err != nil {
			return err
		}
		args = append(args, flags...)
		p, err := startProcess(processName(name, PartConnexd), c.opts.Connexd, args, connexdReady, c.log)
		if err != nil {
			return err
		}
		c.mu.Lock()
		n.connexd = p
		c.mu.Unlock()
		if _, err := p.waitReady(ctx, c.opts.StartTimeout); err != nil {
			return err
		}
	}
	if part == PartBoth || part == PartEngine {
		args := c.opts.simArgs(name, n.role, natsURL)
		dataDir := filepath.Join(c.dir, name)
		if err := os.MkdirAll(dataDir, 0o755); err != nil {
			return fmt.Errorf("localcluster: %s data dir: %w", name, err)
		}
		flags, err := c.creds("--nats-creds", filepath.Join(dataDir, "engine.creds"), "--role", "engine", "--member", name, "--engine", name)
		if err != nil {
			return err
		}
		args = append(args, flags...)
		p, err := startProcess(processName(name, PartEngine), c.opts.Sim, args, simReady, c.log)
		if err != nil {
			return err
		}
		c.mu.Lock()
		n.engine = p
		c.mu.Unlock()
		fields, err := p.waitReady(ctx, c.opts.StartTimeout)
		if err != nil {
			return err
		}
		if fields["http"] == "" {
			return fmt.Errorf("localcluster: %s's ready line has no http= field; last output:\n%s", p.name, p.logs())
		}
		c.mu.Lock()
		n.url = fields["http"]
		c.mu.Unlock()
	}
	return nil
}

// WaitReady waits until the router's GET /ready answers 200 (it has seen a
// prefill and a decode engine), within Options.StartTimeout.
func (c *Cluster) WaitReady(ctx context.Context) error {
	c.mu.Lock()
	r, url := c.router, c.routerURL
	c.mu.Unlock()
	if r == nil || url == "" {
		return errors.New("localcluster: no router")
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	if err := pollReady(ctx, url+"/ready", readyPoll, r.exited); err != nil {
		return fmt.Errorf("localcluster: router not ready: %w; router's last output:\n%s", err, r.logs())
	}
	return nil
}

// WaitEngines waits until the router's GET /connex/v1/engines lists as live
// exactly the engines whose connex-sim and connexd both run and are not
// stopped, each at its current URL, within Options.StartTimeout: after
// Start, AddEngine or Restart, every engine is pickable; after Kill, Stop or
// Term of an engine, the router no longer picks it. A router without that
// endpoint (404) is taken at its word (WaitReady).
func (c *Cluster) WaitEngines(ctx context.Context) error {
	c.mu.Lock()
	r, url := c.router, c.routerURL
	c.mu.Unlock()
	if r == nil || url == "" {
		return errors.New("localcluster: no router")
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	last := "no answer yet"
	for {
		want := c.advertised()
		listed, err := getEngines(ctx, client, url+"/connex/v1/engines")
		switch {
		case errors.Is(err, errNoEngineList):
			return nil
		case err != nil:
			if ctx.Err() == nil {
				last = err.Error()
			}
		default:
			if last = enginesDiff(listed, want); last == "" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("localcluster: the router's engines differ from the running ones (%w): %s", ctx.Err(), last)
		case <-r.exited:
			return fmt.Errorf("localcluster: the router exited; last output:\n%s", r.logs())
		case <-t.C:
		}
	}
}

// advertised maps the engines that should be live (both processes run, not
// stopped) to their URLs.
func (c *Cluster) advertised() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]string{}
	for name, n := range c.nodes {
		if n.engine != nil && n.connexd != nil && n.engine.live() && n.connexd.live() && n.url != "" {
			out[name] = n.url
		}
	}
	return out
}

// AddEngine starts one more engine of role (the next free index) while the
// cluster runs and returns its name once its connex-sim is ready.
func (c *Cluster) AddEngine(ctx context.Context, role Role) (string, error) {
	if role != RolePrefill && role != RoleDecode {
		return "", fmt.Errorf("localcluster: role %q is not %q or %q", role, RolePrefill, RoleDecode)
	}
	if c.isClosed() {
		return "", errors.New("localcluster: cluster closed")
	}
	name := c.newNode(role)
	return name, c.startNode(ctx, name, PartBoth)
}

func (c *Cluster) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// procs resolves target to its processes (engine before connexd).
func (c *Cluster) procs(target string) (Target, []*process, error) {
	t, err := ParseTarget(target)
	if err != nil {
		return t, nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.Name == RouterName {
		if c.router == nil {
			return t, nil, errors.New("localcluster: no router")
		}
		return t, []*process{c.router}, nil
	}
	n, ok := c.nodes[t.Name]
	if !ok {
		return t, nil, fmt.Errorf("localcluster: no engine %q in this cluster", t.Name)
	}
	var ps []*process
	if (t.Part == PartBoth || t.Part == PartEngine) && n.engine != nil {
		ps = append(ps, n.engine)
	}
	if (t.Part == PartBoth || t.Part == PartConnexd) && n.connexd != nil {
		ps = append(ps, n.connexd)
	}
	if len(ps) == 0 {
		return t, nil, fmt.Errorf("localcluster: %s has not been started", target)
	}
	return t, ps, nil
}

// Kill SIGKILLs target's processes (a bare engine name: both at once) and
// waits until they are gone.
func (c *Cluster) Kill(target string) error {
	_, ps, err := c.procs(target)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range ps {
		if err := p.signal(syscall.SIGKILL); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range ps {
		<-p.exited
	}
	return errors.Join(errs...)
}

// Stop freezes target's processes with SIGSTOP (a hang: sockets stay open).
func (c *Cluster) Stop(target string) error { return c.signal(target, syscall.SIGSTOP) }

// Cont resumes processes frozen by Stop with SIGCONT.
func (c *Cluster) Cont(target string) error { return c.signal(target, syscall.SIGCONT) }

func (c *Cluster) signal(target string, s syscall.Signal) error {
	_, ps, err := c.procs(target)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range ps {
		if err := p.signal(s); err != nil {
			errs = append(errs, err)
		} else {
			p.setStopped(s == syscall.SIGSTOP)
		}
	}
	if s == syscall.SIGSTOP {
		// The signal is delivered asynchronously: return only once the
		// processes are stopped, so a caller's next step (a client leaving)
		// cannot be seen by a process still running.
		for _, p := range ps {
			if err := waitStopped(p.pid(), 5*time.Second); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// waitStopped polls /proc until process pid is in the stopped state ("T"),
// has exited, or timeout passes. Without /proc it returns at once.
func waitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return nil // gone, or no /proc
		}
		if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(f) > 0 && (f[0] == "T" || f[0] == "t" || f[0] == "Z") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("localcluster: pid %d not stopped %s after SIGSTOP", pid, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// Term stops target gracefully (SIGTERM; SIGKILL after Options.StopTimeout),
// the engine before its connexd: an engine leaving the cluster. Restart
// brings it back.
func (c *Cluster) Term(target string) error {
	_, ps, err := c.procs(target)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range ps {
		if err := p.term(c.opts.StopTimeout); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Restart starts target again with the same name and flags, after stopping
// it as Term does if it still runs (Kill first for a crash), and waits for
// its ready lines. The router keeps its NATS and HTTP addresses (so the
// members reconnect); an engine gets a new HTTP port (Engines has it). It
// does not wait for the router's readiness: call WaitReady for that.
func (c *Cluster) Restart(ctx context.Context, target string) error {
	t, ps, err := c.procs(target)
	if err != nil {
		return err
	}
	if c.isClosed() {
		return errors.New("localcluster: cluster closed")
	}
	for _, p := range ps {
		_ = p.term(c.opts.StopTimeout)
	}
	if t.Name == RouterName {
		c.mu.Lock()
		natsListen, httpListen := c.opts.NATSListen, hostPort(c.routerURL)
		if c.opts.NATSURL == "" {
			natsListen = hostPort(c.natsURL)
		}
		c.mu.Unlock()
		return c.startRouter(ctx, natsListen, httpListen)
	}
	return c.startNode(ctx, t.Name, t.Part)
}

// Close stops every process in reverse order of start (engines, then their
// connexds, then the router; each group in parallel) with SIGTERM, SIGKILLs
// whatever has not exited after Options.StopTimeout, and removes the
// temporary directory. It reports processes that had to be killed; it is
// safe to call more than once.
func (c *Cluster) Close() error {
	c.mu.Lock()
	c.closed = true
	var engines, connexds []*process
	for i := len(c.order) - 1; i >= 0; i-- {
		n := c.nodes[c.order[i]]
		if n.engine != nil {
			engines = append(engines, n.engine)
		}
		if n.connexd != nil {
			connexds = append(connexds, n.connexd)
		}
	}
	router := c.router
	c.mu.Unlock()
	var errs []error
	for _, group := range [][]*process{engines, connexds, {router}} {
		errs = append(errs, c.termAll(group)...)
	}
	if c.ownDir {
		if err := os.RemoveAll(c.dir); err != nil {
			errs = append(errs, fmt.Errorf("localcluster: remove %s: %w", c.dir, err))
		}
	}
	return errors.Join(errs...)
}

func (c *Cluster) termAll(ps []*process) []error {
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		if p == nil {
			continue
		}
		wg.Go(func() { errs[i] = p.term(c.opts.StopTimeout) })
	}
	wg.Wait()
	return errs
}

// RouterURL is the router's HTTP base URL, e.g. http://127.0.0.1:8000.
func (c *Cluster) RouterURL() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.routerURL
}

// NATSURL is the URL every member uses (the router's embedded server unless
// Options.NATSURL named one).
func (c *Cluster) NATSURL() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.natsURL
}

// Dir is the directory holding the connexds' data dirs.
func (c *Cluster) Dir() string { return c.dir }

// Engines lists the engines in start order.
func (c *Cluster) Engines() []Engine {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Engine, 0, len(c.order))
	for _, name := range c.order {
		n := c.nodes[name]
		e := Engine{Name: n.name, Role: n.role, URL: n.url}
		if n.engine != nil {
			e.EnginePID = n.engine.pid()
		}
		if n.connexd != nil {
			e.ConnexdPID = n.connexd.pid()
		}
		out = append(out, e)
	}
	return out
}

// EngineURL is engine name's HTTP base URL.
func (c *Cluster) EngineURL(name string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.nodes[name]
	if !ok || n.url == "" {
		return "", fmt.Errorf("localcluster: no running engine %q", name)
	}
	return n.url, nil
}

// PID is the process id of a one-process target: "router",
// "decode-1/engine" or "decode-1/connexd".
func (c *Cluster) PID(target string) (int, error) {
	_, ps, err := c.procs(target)
	if err != nil {
		return 0, err
	}
	if len(ps) != 1 {
		return 0, fmt.Errorf("localcluster: %q names %d processes; add /engine or /connexd", target, len(ps))
	}
	return ps[0].pid(), nil
}

// PIDs maps every process's name ("router", "decode-1/engine", …) to its
// current process id.
func (c *Cluster) PIDs() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	if c.router != nil {
		out[c.router.name] = c.router.pid()
	}
	for _, n := range c.nodes {
		for _, p := range []*process{n.engine, n.connexd} {
			if p != nil {
				out[p.name] = p.pid()
			}
		}
	}
	return out
}

// ReadyField is a field of the ready line target's process printed at its
// last start ("metrics" of a connexd started with --metrics-listen, "http"
// of an engine); target must name one process ("decode-1/connexd",
// "router"). "" when the line had no such field.
func (c *Cluster) ReadyField(target, key string) (string, error) {
	_, ps, err := c.procs(target)
	if err != nil {
		return "", err
	}
	if len(ps) != 1 {
		return "", fmt.Errorf("localcluster: %s names %d processes; name one (…/engine or …/connexd)", target, len(ps))
	}
	ps[0].mu.Lock()
	defer ps[0].mu.Unlock()
	return ps[0].fields[key], nil
}

// Running reports whether every process of target is alive (a stopped
// process is alive).
func (c *Cluster) Running(target string) bool {
	_, ps, err := c.procs(target)
	if err != nil {
		return false
	}
	for _, p := range ps {
		if !p.running() {
			return false
		}
	}
	return true
}

// Logs is the last output lines of target's processes, each block headed
// by the process's name.
func (c *Cluster) Logs(target string) string {
	_, ps, err := c.procs(target)
	if err != nil {
		return err.Error()
	}
	var s string
	for _, p := range ps {
		s += fmt.Sprintf("== %s (pid %d)\n%s\n", p.name, p.pid(), p.logs())
	}
	return s
}

// AllLogs is Logs for every process, router first, engines by name.
func (c *Cluster) AllLogs() string {
	c.mu.Lock()
	names := append([]string(nil), c.order...)
	c.mu.Unlock()
	sort.Strings(names)
	s := c.Logs(RouterName)
	for _, n := range names {
		s += c.Logs(n)
	}
	return s
}
