package chaos

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// FaultReport is what one fault did.
type FaultReport struct {
	At       time.Duration `json:"at_ns"`
	Action   Action        `json:"action"`
	Target   string        `json:"target"`
	Resolved string        `json:"resolved,omitempty"`
	Took     time.Duration `json:"took_ns"`
	Skipped  string        `json:"skipped,omitempty"`
	Error    string        `json:"error,omitempty"`
}

func (r *run) runFaults(ctx context.Context) {
	for _, f := range r.sc.Faults {
		wait := time.Until(r.t0.Add(time.Duration(f.At)))
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
		r.fault(ctx, f)
	}
}

func (r *run) fault(ctx context.Context, f Fault) {
	fr := FaultReport{At: time.Since(r.t0), Action: f.Action, Target: f.Target}
	defer func() {
		r.mu.Lock()
		r.faults = append(r.faults, fr)
		r.mu.Unlock()
		r.note("fault at %s: %s %s → %s %s%s", fr.At.Round(time.Millisecond), fr.Action, fr.Target, fr.Resolved, fr.Skipped, fr.Error)
	}()
	if f.Action == ActNATSRestart {
		fr.Resolved = "nats"
		t0 := time.Now()
		if err := r.nats.restart(ctx); err != nil {
			fr.Error = err.Error()
		}
		fr.Took = time.Since(t0)
		return
	}
	t, _ := ParseTarget(f.Target, r.sc.Nodes) // checked by the scenario
	r.mu.Lock()
	target, ok, why := r.fleet.resolve(r.rng, f.Action, t)
	r.mu.Unlock()
	if !ok {
		fr.Skipped = why
		return
	}
	fr.Resolved = target
	t0 := time.Now()
	err := r.apply(ctx, f.Action, target)
	fr.Took = time.Since(t0)
	if err != nil {
		fr.Error = err.Error()
	}
	node, _, _ := strings.Cut(target, "/")
	if err == nil && (strings.HasPrefix(node, "prefill-") || node == "router") {
		r.mu.Lock()
		switch f.Action {
		case ActKill, ActStop, ActPartition:
			if _, open := r.down[node]; !open {
				r.down[node] = fr.At
			}
		default:
			if from, open := r.down[node]; open {
				r.windows = append(r.windows, faultWindow{node: node, from: from, till: time.Since(r.t0)})
				delete(r.down, node)
			}
		}
		r.mu.Unlock()
	}
}

func (r *run) apply(ctx context.Context, a Action, target string) error {
	switch a {
	case ActKill:
		return r.c.Kill(target)
	case ActStop:
		return r.c.Stop(target)
	case ActCont:
		return r.c.Cont(target)
	case ActRestart:
		return r.c.Restart(ctx, target)
	case ActPartition, ActHeal:
		node, _, _ := strings.Cut(target, "/")
		r.mu.Lock()
		p := r.proxies[node]
		r.mu.Unlock()
		if p == nil {
			return fmt.Errorf("%s has no NATS link of its own to cut (the router's is the server's)", target)
		}
		p.setCut(a == ActPartition)
		return nil
	}
	return fmt.Errorf("unknown action %q", a)
}

// healAll continues, restarts and heals whatever the faults left broken,
// so that the checks see a whole cluster.
func (r *run) healAll(ctx context.Context) {
	r.mu.Lock()
	broken := r.fleet.faulted()
	r.mu.Unlock()
	nodes := map[string]nodeState{}
	for p, s := range broken {
		node, _, _ := strings.Cut(p, "/")
		if s > nodes[node] {
			nodes[node] = s
		}
	}
	for node, s := range nodes {
		var t Target
		if node == "router" {
			t = Target{Role: "router"}
		} else {
			role, idx, _ := strings.Cut(node, "-")
			i, _ := strconv.Atoi(idx)
			t = Target{Role: role, Index: i}
		}
		var a Action
		switch s {
		case stopped:
			a = ActCont
		case killed:
			a = ActRestart
		case cut:
			a = ActHeal
		}
		// Each process of the node separately, as they may differ.
		for _, part := range []localcluster.Part{localcluster.PartConnexd, localcluster.PartEngine} { // a connexd before its engine
			if node == "router" && part == localcluster.PartEngine {
				continue
			}
			tp := t
			tp.Part = part
			r.mu.Lock()
			target, ok, _ := r.fleet.resolve(r.rng, a, tp)
			r.mu.Unlock()
			if !ok {
				continue
			}
			if err := r.apply(ctx, a, target); err != nil {
				r.note("healing %s (%s): %v", target, a, err)
			}
		}
	}
	r.mu.Lock()
	for node, from := range r.down {
		r.windows = append(r.windows, faultWindow{node: node, from: from, till: time.Since(r.t0)})
	}
	r.down = map[string]time.Duration{}
	r.mu.Unlock()
	if err := r.c.WaitReady(ctx); err != nil {
		r.note("the router is not ready after healing: %v", err)
	}
}
