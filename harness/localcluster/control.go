package localcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

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
// temporary directory. It first cancels pending automatic restarts
// (Options.Restart) and waits for one under way, so no process outlives it.
// It reports processes that had to be killed; it is safe to call more than
// once.
func (c *Cluster) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	// No automatic restart starts from now on; one under way gives up its
	// wait and its process, if any, is recorded by now and stopped below.
	c.endLife()
	c.restarts.Wait()
	c.mu.Lock()
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
	errs = append(errs, c.closeEngineLogs())
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
