package localcluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
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

	// life ends when Close begins: it cancels pending automatic restarts
	// and the start of one under way; restarts counts the watchers (watch).
	life     context.Context
	endLife  context.CancelFunc
	restarts sync.WaitGroup

	mu          sync.Mutex
	router      *process
	natsURL     string
	routerURL   string
	authDir     string // the router's authority (its embedded NATS has auth on); "" without
	nodes       map[string]*node
	order       []string // node names in start order
	next        map[Role]int
	closed      bool
	backoff     map[string]time.Duration // process name → the delay of its last automatic restart
	promTargets bool                     // WritePrometheusConfig ran: restarts rewrite its targets
	engineUIDs  map[string]User          // engine name → its own uid and gid under Options.EngineUser
	engineLogs  map[string]*lineLog      // engine name → its log file under VLLM.LogDir
}

// EngineUser is the uid and gid engine name runs under (Options.EngineUser
// plus its index), or nil when it runs as the launcher or has not started.
func (c *Cluster) EngineUser(name string) *User {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u, ok := c.engineUIDs[name]; ok {
		return &u
	}
	return nil
}

// engineUser is the uid and gid engine name runs under with
// Options.EngineUser: the base plus the engine's index in start order, the
// same across its restarts. Engines sharing a uid could read each other's
// engine.creds and speak as each other.
func (c *Cluster) engineUser(name string) (*User, error) {
	base := c.opts.EngineUser
	if base == nil {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if u, ok := c.engineUIDs[name]; ok {
		return &u, nil
	}
	i := uint64(len(c.engineUIDs))
	if uint64(base.UID)+i > math.MaxUint32-1 || uint64(base.GID)+i > math.MaxUint32-1 {
		return nil, fmt.Errorf("localcluster: engine %s: uid %d + %d is past the largest uid", name, base.UID, i)
	}
	u := User{UID: base.UID + uint32(i), GID: base.GID + uint32(i)}
	if c.engineUIDs == nil {
		c.engineUIDs = map[string]User{}
	}
	c.engineUIDs[name] = u
	return &u, nil
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
	c := &Cluster{opts: o, log: &lineLog{w: o.Log}, nodes: map[string]*node{}, next: map[Role]int{}, backoff: map[string]time.Duration{}}
	c.life, c.endLife = context.WithCancel(context.Background())
	if o.Dir != "" {
		c.dir = o.Dir
	} else if c.dir, err = os.MkdirTemp("", "connex-local-"); err != nil {
		return nil, fmt.Errorf("localcluster: temp dir: %w", err)
	}
	c.ownDir = o.Dir == ""
	if o.EngineUser != nil {
		// Engines under their own uid reach their own data dir (and the
		// engine.creds inside) only through this one.
		if err := os.Chmod(c.dir, 0o711); err != nil {
			return nil, fmt.Errorf("localcluster: make %s traversable for the engines' user: %w", c.dir, err)
		}
	}
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
	keys, err := writeKeyFiles(dataDir, c.opts.APIKey, c.opts.AdminKey)
	if err != nil {
		return err
	}
	args = append(args, keys...)
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
	c.watch(p)
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
		c.watch(p)
		if _, err := p.waitReady(ctx, c.opts.StartTimeout); err != nil {
			return err
		}
	}
	if (part == PartBoth || part == PartEngine) && c.opts.VLLM != nil {
		p, url, err := c.startVLLM(ctx, n, c.index(name), natsURL)
		if p != nil {
			c.mu.Lock()
			n.engine = p
			c.mu.Unlock()
			c.watch(p)
		}
		if err != nil {
			return err
		}
		c.mu.Lock()
		n.url = url
		c.mu.Unlock()
		return nil
	}
	if part == PartBoth || part == PartEngine {
		args := c.opts.simArgs(name, n.role, natsURL)
		dataDir := filepath.Join(c.dir, name)
		if err := os.MkdirAll(dataDir, 0o755); err != nil {
			return fmt.Errorf("localcluster: %s data dir: %w", name, err)
		}
		// The engine's credentials allow only its role and model
		// (docs/security.md).
		flags, err := c.creds("--nats-creds", filepath.Join(dataDir, "engine.creds"), "--role", "engine", "--member", name, "--engine", name,
			"--engine-role", string(n.role), "--model", c.opts.Model)
		if err != nil {
			return err
		}
		args = append(args, flags...)
		user, err := c.engineUser(name)
		if err != nil {
			return err
		}
		if u := user; u != nil && len(flags) == 2 {
			if err := os.Chown(flags[1], int(u.UID), int(u.GID)); err != nil {
				return fmt.Errorf("localcluster: hand %s to the engines' user %d: %w", flags[1], u.UID, err)
			}
		}
		p, err := startProcessAs(processName(name, PartEngine), c.opts.Sim, args, simReady, c.log, childEnv(), user)
		if err != nil {
			return err
		}
		c.mu.Lock()
		n.engine = p
		c.mu.Unlock()
		c.watch(p)
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

// index is engine name's position in start order (its core with vLLM).
func (c *Cluster) index(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, n := range c.order {
		if n == name {
			return i
		}
	}
	return 0
}

// routerAt is the router's process and URL, or an error when the cluster
// runs none (yet).
func (c *Cluster) routerAt() (*process, string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.router == nil || c.routerURL == "" {
		return nil, "", errors.New("localcluster: no router")
	}
	return c.router, c.routerURL, nil
}

// WaitReady waits until the router's GET /ready answers 200 (it has seen a
// prefill and a decode engine), within Options.StartTimeout.
func (c *Cluster) WaitReady(ctx context.Context) error {
	r, url, err := c.routerAt()
	if err != nil {
		return err
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
	r, url, err := c.routerAt()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	t := time.NewTicker(readyPoll)
	defer t.Stop()
	last := "no answer yet"
	for {
		want := c.advertised()
		listed, err := getEngines(ctx, client, url+"/connex/v1/engines", c.opts.AdminKey)
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

// adminKeyFile is the router's admin key file in its data dir.
const adminKeyFile = "admin.key"

// writeKeyFiles writes the router's keys into files only its user reads
// (flags would show them in ps) and returns the flags naming them.
func writeKeyFiles(dir, apiKey, adminKey string) ([]string, error) {
	var flags []string
	for _, k := range []struct{ flag, name, key string }{
		{"--api-key-file", "api.key", apiKey},
		{"--admin-api-key-file", adminKeyFile, adminKey},
	} {
		if k.key == "" {
			continue
		}
		path := filepath.Join(dir, k.name)
		if err := os.WriteFile(path, []byte(k.key+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("localcluster: router key file: %w", err)
		}
		flags = append(flags, k.flag, path)
	}
	return flags, nil
}
