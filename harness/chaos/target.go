package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/connex/connex/harness/localcluster"
)

// Target is a parsed fault target: a node ("decode-1", "router", "nats"),
// or any node of a role ("decode-any"), and which of its processes.
type Target struct {
	Role  string // "prefill", "decode", "router" or "nats"
	Index int    // the node's index; -1 for "-any"
	Part  localcluster.Part
}

// ParseTarget reads decode-<i>, prefill-<i>, decode-any, prefill-any,
// router or nats, with /engine or /connexd to name one process of an
// engine's pair (a bare name means both). Indexes must exist in n.
func ParseTarget(s string, n Nodes) (Target, error) {
	name, part, hasPart := strings.Cut(s, "/")
	t := Target{Part: localcluster.Part(part)}
	if hasPart && t.Part != localcluster.PartEngine && t.Part != localcluster.PartConnexd {
		return t, fmt.Errorf("target %q: the part after / must be engine or connexd", s)
	}
	switch name {
	case "router", "nats":
		if hasPart {
			return t, fmt.Errorf("target %q: %s has no parts", s, name)
		}
		return Target{Role: name, Index: 0}, nil
	}
	role, idx, ok := strings.Cut(name, "-")
	if !ok || (role != "prefill" && role != "decode") {
		return t, fmt.Errorf("target %q: want decode-<i>, prefill-<i>, decode-any, prefill-any, router or nats (with /engine or /connexd for one process)", s)
	}
	t.Role = role
	if idx == "any" {
		t.Index = -1
		return t, nil
	}
	i, err := strconv.Atoi(idx)
	if err != nil || i < 0 || strconv.Itoa(i) != idx {
		return t, fmt.Errorf("target %q: %q is not a node index", s, idx)
	}
	max := n.Decode
	if role == "prefill" {
		max = n.Prefill
	}
	if i >= max {
		return t, fmt.Errorf("target %q: the scenario has %d %s node(s) (0..%d)", s, max, role, max-1)
	}
	t.Index = i
	return t, nil
}

// nodeState is what the faults so far did to one process.
type nodeState int

const (
	running nodeState = iota
	stopped           // SIGSTOPped
	killed            // SIGKILLed, not restarted yet
	cut               // partitioned
)

// fleet tracks the state of every process the faults touch, so that a
// "-any" target picks a process the action makes sense for (kill a running
// one, continue a stopped one, restart a killed one). It is pure: the seed's
// generator is passed in.
type fleet struct {
	nodes Nodes
	state map[string]nodeState // by process: "decode-1/engine", "decode-1/connexd", "router/connexd"
}

func newFleet(n Nodes) *fleet { return &fleet{nodes: n, state: map[string]nodeState{}} }

func nodeName(role string, i int) string { return role + "-" + strconv.Itoa(i) }

// processes is what target t names on node name.
func processes(name string, p localcluster.Part) []string {
	if name == "router" {
		return []string{"router/connexd"}
	}
	switch p {
	case localcluster.PartEngine:
		return []string{name + "/engine"}
	case localcluster.PartConnexd:
		return []string{name + "/connexd"}
	}
	return []string{name + "/engine", name + "/connexd"}
}

// wants is the state a process must be in for action a to apply.
func wants(a Action) nodeState {
	switch a {
	case ActCont:
		return stopped
	case ActRestart:
		return killed
	case ActHeal:
		return cut
	}
	return running
}

// after is the state action a leaves.
func after(a Action) nodeState {
	switch a {
	case ActKill:
		return killed
	case ActStop:
		return stopped
	case ActPartition:
		return cut
	}
	return running
}

// resolve picks the concrete localcluster target of a fault and records
// what it does; ok is false when no node is in a state the action applies
// to (the fault is skipped, and the report says why).
func (f *fleet) resolve(rng *rand.Rand, a Action, t Target) (target string, ok bool, why string) {
	if t.Role == "nats" {
		return "nats", true, ""
	}
	var names []string
	switch {
	case t.Role == "router":
		names = []string{"router"}
	case t.Index >= 0:
		names = []string{nodeName(t.Role, t.Index)}
	default:
		max := f.nodes.Decode
		if t.Role == "prefill" {
			max = f.nodes.Prefill
		}
		for i := range max {
			names = append(names, nodeName(t.Role, i))
		}
	}
	need := wants(a)
	var fit []string
	for _, n := range names {
		if slices.IndexFunc(processes(n, t.Part), func(p string) bool { return f.state[p] != need }) < 0 {
			fit = append(fit, n)
		}
	}
	if len(fit) == 0 {
		return "", false, fmt.Sprintf("no %s node is in a state %s applies to", t.Role, a)
	}
	name := fit[rng.IntN(len(fit))]
	for _, p := range processes(name, t.Part) {
		f.state[p] = after(a)
	}
	if name == "router" {
		return "router", true, ""
	}
	if t.Part == localcluster.PartBoth {
		return name, true, ""
	}
	return name + "/" + string(t.Part), true, ""
}

// faulted lists the processes not running normally now (stopped, killed or
// cut), for the end of the run: they are continued, restarted or healed
// before the checks.
func (f *fleet) faulted() map[string]nodeState {
	out := map[string]nodeState{}
	for p, s := range f.state {
		if s != running {
			out[p] = s
		}
	}
	return out
}
