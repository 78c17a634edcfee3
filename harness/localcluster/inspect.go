package localcluster

import (
	"fmt"
	"path/filepath"
	"sort"
)

// RouterURL is the router's HTTP base URL, e.g. http://127.0.0.1:8000.
func (c *Cluster) RouterURL() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.routerURL
}

// APIKey is the key the router requires on /v1/* (Options.APIKey; empty:
// none).
func (c *Cluster) APIKey() string { return c.opts.APIKey }

// AdminKey is the key the router requires on /connex/v1/* and /metrics:
// send it as "Authorization: Bearer <key>".
func (c *Cluster) AdminKey() string { return c.opts.AdminKey }

// AdminKeyFile is the file holding AdminKey (readable by its owner only).
func (c *Cluster) AdminKeyFile() string { return filepath.Join(c.dir, RouterName, adminKeyFile) }

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
