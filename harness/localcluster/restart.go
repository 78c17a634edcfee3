package localcluster

import (
	"fmt"
	"time"
)

// RestartPhase is the step of an automatic restart a RestartEvent reports.
type RestartPhase int

// The steps of an automatic restart (Options.Restart).
const (
	// RestartScheduled: the process exited unasked; it is started again
	// after Delay.
	RestartScheduled RestartPhase = iota
	// Restarted: the new process runs (NewPID) and printed its ready line.
	Restarted
	// RestartFailed: the new process did not come up (Err). If it exited,
	// it is scheduled again with a longer delay; if it hangs, it is left
	// as it is (Cluster.Restart or Close deal with it).
	RestartFailed
)

// RestartEvent reports one step of an automatic restart to
// Options.OnRestart.
type RestartEvent struct {
	Phase RestartPhase
	// Target is the process: "router", "decode-0/engine" or
	// "decode-0/connexd" (only the part that died is restarted).
	Target string
	// OldPID is the process that exited, and Exit why, as os/exec says it:
	// "signal: killed", "exit status 1".
	OldPID int
	Exit   string
	// Delay is the wait before the restart (RestartScheduled).
	Delay time.Duration
	// NewPID is the restarted process (Restarted); URL is a restarted
	// engine's new HTTP base URL, and Metrics the restarted process's own
	// /metrics URL ("" when it serves none).
	NewPID  int
	URL     string
	Metrics string
	// Err is why the restart failed (RestartFailed).
	Err error
}

// String is the event as one line for a person.
func (e RestartEvent) String() string {
	switch e.Phase {
	case RestartScheduled:
		return fmt.Sprintf("%s (pid %d) exited (%s); restarting it in %s", e.Target, e.OldPID, e.Exit, e.Delay)
	case Restarted:
		s := fmt.Sprintf("%s restarted: pid %d (was %d, %s)", e.Target, e.NewPID, e.OldPID, e.Exit)
		if e.URL != "" {
			s += ", " + e.URL
		}
		return s
	default:
		return fmt.Sprintf("%s (pid %d, %s) did not restart: %v", e.Target, e.OldPID, e.Exit, e.Err)
	}
}

// watch arms Options.Restart for p, a process just started and recorded
// in the cluster: once p exits without having been asked to, the same part
// is started again after the policy's delay. Close cancels a pending
// restart and waits for one under way.
func (c *Cluster) watch(p *process) {
	if !c.opts.Restart.Enabled() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.restarts.Add(1)
	go func() {
		defer c.restarts.Done()
		select {
		case <-p.exited:
			c.restartExited(p)
		case <-c.life.Done():
		}
	}()
}

// restartExited restarts p's part after the policy's delay, unless its
// exit was asked for, the cluster closes first, or someone restarted it
// meanwhile.
func (c *Cluster) restartExited(p *process) {
	intended, why, ran := p.exit()
	if intended {
		return
	}
	c.mu.Lock()
	delay := c.opts.Restart.Delay(c.backoff[p.name], ran)
	c.backoff[p.name] = delay
	c.mu.Unlock()
	ev := RestartEvent{Phase: RestartScheduled, Target: p.name, OldPID: p.pid(), Exit: why, Delay: delay}
	c.report(ev)
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-c.life.Done():
		return
	case <-t.C:
	}
	if _, ps, err := c.procs(p.name); err != nil || len(ps) != 1 || ps[0] != p {
		return // restarted or replaced by hand meanwhile
	}
	if err := c.Restart(c.life, p.name); err != nil {
		if c.life.Err() == nil {
			ev.Phase, ev.Err = RestartFailed, err
			c.report(ev)
		}
		return
	}
	ev.Phase = Restarted
	ev.NewPID, _ = c.PID(p.name)
	own := p.name
	if own == RouterName {
		own = RouterName + "/" + string(PartConnexd) // the front door's URL does not move
	}
	for _, m := range c.MetricsTargets() {
		if m.Process == own {
			ev.Metrics = m.URL
		}
	}
	if t, _ := ParseTarget(p.name); t.Part == PartEngine {
		ev.URL, _ = c.EngineURL(t.Name)
	}
	c.mu.Lock()
	rewrite := c.promTargets
	c.mu.Unlock()
	if rewrite {
		if err := c.writePrometheusTargets(); err != nil {
			c.log.note("localcluster: %v", err)
		}
	}
	c.report(ev)
}

// report hands ev to Options.OnRestart, or notes it in Options.Log.
func (c *Cluster) report(ev RestartEvent) {
	if c.opts.OnRestart != nil {
		c.opts.OnRestart(ev)
		return
	}
	c.log.note("localcluster: %s", ev)
}
