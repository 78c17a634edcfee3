package chaos

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Scenario is one chaos run, as a YAML file describes it (see
// harness/chaos/scenarios/ and docs/chaos.md).
type Scenario struct {
	// Name labels the report and the picture (default: the file's name).
	Name string `yaml:"name"`
	// Seed makes the run repeatable: prompts, "-any" targets.
	Seed int64 `yaml:"seed"`
	// Timeout bounds the whole run, start-up and checks included.
	Timeout Duration `yaml:"timeout"`
	Nodes   Nodes    `yaml:"nodes"`
	Engine  Engine   `yaml:"engine"`
	// Shapes gives engines their KV shape by node name (prefill-0,
	// decode-1, …); the nodes not named keep connex-sim's default (TP 1,
	// 16-token blocks, nhd). Engines of any shapes exchange KV: connexd
	// translates it (docs/architecture/kv-layouts.md).
	Shapes map[string]Shape `yaml:"shapes"`
	Load   Load             `yaml:"load"`
	Faults []Fault          `yaml:"faults"`
	// RetainS is every connexd's retain_s: how long an orphaned hold
	// lives (the leak check waits for it).
	RetainS int `yaml:"retain_s"`
	// Burn saturates the machine's CPUs beside the load (burn.go).
	Burn Burn `yaml:"burn"`
	// Expect adds checks beyond the invariants, for scenarios whose
	// point is that nothing fails (a saturated box with every engine
	// alive).
	Expect Expect `yaml:"expect"`
}

// Burn is CPU load the harness runs beside the cluster: Procs processes
// that each spin one core at the cluster's own priority, from just before
// the load starts until it ends. 0 burns nothing.
type Burn struct {
	// Procs is how many burner processes spin (0..64); twice the cores
	// keeps every core busy however the kernel places them.
	Procs int `yaml:"procs"`
}

// Expect lists outcomes a scenario demands on top of the invariants.
type Expect struct {
	// NoErrors: every request completes; an error answer, however clear,
	// breaks the run (InvNoErrors).
	NoErrors bool `yaml:"no_errors"`
	// NoResumes: no request is moved to another decode engine (InvNoResumes):
	// with every engine alive, a resume means one was wrongly taken for dead
	// or stalled.
	NoResumes bool `yaml:"no_resumes"`
	// FalseStallsMaxPct, if set, bounds the resumes the router made for a
	// stall although the engine lived (connex_router_false_resumes_total
	// {reason="stalled"}), in percent of the requests (InvFalseStalls): the
	// stall rule's false alarms. Moving the stream of an engine whose
	// connexd left (engine_left) is not one.
	// 0 allows none; unset (nil) checks nothing.
	FalseStallsMaxPct *float64 `yaml:"false_stalls_max_pct"`
}

// Bounds of a scenario, so that a typo cannot make the harness allocate
// without end or overflow a duration.
const (
	// MaxRequests bounds load.requests.
	MaxRequests = 1_000_000
	// MaxTokens bounds load.prompt_tokens + load.max_tokens (each, and
	// their sum).
	MaxTokens = 16384
	// MaxFaults bounds the faults once repeats are unrolled.
	MaxFaults = 10_000
	// maxPrefillUSPerToken and maxDecodeMSPerToken bound the simulated
	// engine's costs (one second a token).
	maxPrefillUSPerToken = 1_000_000
	maxDecodeMSPerToken  = 1_000
)

// Nodes is the cluster's size: engines of each role, each with its own
// connexd, behind one router.
type Nodes struct {
	Prefill int `yaml:"prefill"`
	Decode  int `yaml:"decode"`
}

// Engine is the simulated engine's cost model.
type Engine struct {
	PrefillUSPerToken int     `yaml:"prefill_us_per_token"`
	DecodeMSPerToken  float64 `yaml:"decode_ms_per_token"`
}

// Shape is one engine's KV shape: connex-sim's --tp, --block-size and
// --kv-order (zero: its default).
type Shape struct {
	TP        int    `yaml:"tp"`
	BlockSize int    `yaml:"block_size"`
	KVOrder   string `yaml:"kv_order"`
}

// SimArgs are the connex-sim flags of the shape.
func (s Shape) SimArgs() []string {
	var out []string
	if s.TP > 0 {
		out = append(out, "--tp", strconv.Itoa(s.TP))
	}
	if s.BlockSize > 0 {
		out = append(out, "--block-size", strconv.Itoa(s.BlockSize))
	}
	if s.KVOrder != "" {
		out = append(out, "--kv-order", s.KVOrder)
	}
	return out
}

// Load is what the clients send through the router.
type Load struct {
	Requests     int `yaml:"requests"`
	Concurrency  int `yaml:"concurrency"`
	PromptTokens int `yaml:"prompt_tokens"`
	MaxTokens    int `yaml:"max_tokens"`
	// Stream is the share of requests that stream (0..1; true = 1).
	Stream Share `yaml:"stream"`
	// Chat is the share of requests sent to /v1/chat/completions.
	Chat Share `yaml:"chat"`
}

// Fault is one action at a time after the load starts.
type Fault struct {
	At     Duration `yaml:"at"`
	Action Action   `yaml:"action"`
	Target string   `yaml:"target"`
	// Every and Times repeat the fault (soak scenarios): Times in all,
	// Every apart, from At.
	Every Duration `yaml:"every"`
	Times int      `yaml:"times"`
	line  int
}

// Action is what a fault does.
type Action string

// Fault actions.
const (
	ActKill        Action = "kill"         // SIGKILL
	ActStop        Action = "stop"         // SIGSTOP (a hang)
	ActCont        Action = "cont"         // SIGCONT
	ActRestart     Action = "restart"      // start a killed target again, same name
	ActPartition   Action = "partition"    // cut the target's links to NATS
	ActHeal        Action = "heal"         // restore them
	ActNATSRestart Action = "nats-restart" // kill the NATS server and start it again
)

var actions = []Action{ActKill, ActStop, ActCont, ActRestart, ActPartition, ActHeal, ActNATSRestart}

// Duration is a YAML duration ("1.5s", "300ms").
type Duration time.Duration

// UnmarshalYAML reads a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || v < 0 {
		return lineErr(n, "%q is not a duration (e.g. 1.5s, 300ms)", n.Value)
	}
	*d = Duration(v)
	return nil
}

// Share is a fraction in [0, 1]; true and false mean 1 and 0.
type Share float64

// UnmarshalYAML reads a bool or a number in [0, 1].
func (s *Share) UnmarshalYAML(n *yaml.Node) error {
	switch n.Value {
	case "true":
		*s = 1
		return nil
	case "false":
		*s = 0
		return nil
	}
	v, err := strconv.ParseFloat(n.Value, 64)
	if err != nil || v < 0 || v > 1 {
		return lineErr(n, "%q: want true, false or a share in [0, 1]", n.Value)
	}
	*s = Share(v)
	return nil
}

// UnmarshalYAML checks the action name.
func (a *Action) UnmarshalYAML(n *yaml.Node) error {
	for _, x := range actions {
		if n.Value == string(x) {
			*a = x
			return nil
		}
	}
	names := make([]string, len(actions))
	for i, x := range actions {
		names[i] = string(x)
	}
	return lineErr(n, "unknown action %q (allowed: %s)", n.Value, strings.Join(names, ", "))
}

// UnmarshalYAML reads one fault, refusing unknown fields, and keeps its
// line for later messages.
func (f *Fault) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return lineErr(n, "a fault is a mapping {at, action, target}")
	}
	*f = Fault{line: n.Line}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if seen[k.Value] {
			return lineErr(k, "field %s given twice in one fault", k.Value)
		}
		seen[k.Value] = true
		var err error
		switch k.Value {
		case "at":
			err = v.Decode(&f.At)
		case "action":
			err = v.Decode(&f.Action)
		case "target":
			err = v.Decode(&f.Target)
		case "every":
			err = v.Decode(&f.Every)
		case "times":
			if err = v.Decode(&f.Times); err == nil && f.Times < 1 {
				return lineErr(v, "times = %d: want ≥ 1", f.Times)
			}
		default:
			return lineErr(k, "field %s not found in a fault (allowed: at, action, target, every, times)", k.Value)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ErrScenario means a scenario file is unusable; the message names the
// field, the value and the line.
var ErrScenario = errors.New("chaos: bad scenario")

func lineErr(n *yaml.Node, format string, args ...any) error {
	return fmt.Errorf("%w: line %d: %s", ErrScenario, n.Line, fmt.Sprintf(format, args...))
}

// ParseScenario reads a scenario: unknown fields and bad values are errors
// naming them and their line; missing ones take defaults; the faults are
// checked against the nodes.
func ParseScenario(data []byte) (*Scenario, error) {
	s := &Scenario{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(s); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: the file is empty", ErrScenario)
		}
		if errors.Is(err, ErrScenario) {
			return nil, err
		}
		var te *yaml.TypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("%w: %s", ErrScenario, strings.Join(te.Errors, "; "))
		}
		return nil, fmt.Errorf("%w: %v", ErrScenario, err)
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		line := more.Line
		if len(more.Content) > 0 {
			line = more.Content[0].Line
		}
		return nil, fmt.Errorf("%w: line %d: a second YAML document (one scenario a file)", ErrScenario, line)
	}
	s.defaults()
	if err := s.validate(); err != nil {
		return nil, err
	}
	s.expand()
	return s, nil
}

// expand unrolls repeated faults into single ones, in time order.
func (s *Scenario) expand() {
	var out []Fault
	for _, f := range s.Faults { // bounded and in time by validate
		n := max(f.Times, 1)
		for i := range n {
			g := f
			g.At = Duration(time.Duration(f.At) + time.Duration(i)*time.Duration(f.Every))
			g.Every, g.Times = 0, 0
			if time.Duration(g.At) < time.Duration(s.Timeout) {
				out = append(out, g)
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	s.Faults = out
}

// defaults fills what the scenario file left out (a zero value means "not
// given": no field has a meaningful zero).
func (s *Scenario) defaults() {
	s.Timeout = cmp.Or(s.Timeout, Duration(5*time.Minute))
	s.Nodes.Prefill = cmp.Or(s.Nodes.Prefill, 1)
	s.Nodes.Decode = cmp.Or(s.Nodes.Decode, 2)
	s.Engine.PrefillUSPerToken = cmp.Or(s.Engine.PrefillUSPerToken, 50)
	s.Engine.DecodeMSPerToken = cmp.Or(s.Engine.DecodeMSPerToken, 10)
	s.Load.Requests = cmp.Or(s.Load.Requests, 50)
	s.Load.Concurrency = cmp.Or(s.Load.Concurrency, 4)
	s.Load.PromptTokens = cmp.Or(s.Load.PromptTokens, 64)
	s.Load.MaxTokens = cmp.Or(s.Load.MaxTokens, 64)
	s.RetainS = cmp.Or(s.RetainS, 10)
}

func (s *Scenario) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrScenario, fmt.Sprintf(format, args...))
	}
	switch {
	case s.Nodes.Prefill < 1 || s.Nodes.Prefill > 8:
		return bad("nodes.prefill = %d: want 1..8", s.Nodes.Prefill)
	case s.Nodes.Decode < 1 || s.Nodes.Decode > 16:
		return bad("nodes.decode = %d: want 1..16", s.Nodes.Decode)
	case s.Load.Requests < 1 || s.Load.Requests > MaxRequests || s.Load.Concurrency < 1 || s.Load.Concurrency > 256:
		return bad("load.requests = %d, load.concurrency = %d: want requests 1..%d and concurrency 1..256", s.Load.Requests, s.Load.Concurrency, MaxRequests)
	case s.Load.PromptTokens < 1 || s.Load.MaxTokens < 1 || s.Load.PromptTokens > MaxTokens || s.Load.MaxTokens > MaxTokens ||
		s.Load.PromptTokens+s.Load.MaxTokens > MaxTokens:
		return bad("load.prompt_tokens = %d, load.max_tokens = %d: want both ≥ 1 and their sum ≤ %d", s.Load.PromptTokens, s.Load.MaxTokens, MaxTokens)
	case s.Engine.PrefillUSPerToken < 0 || s.Engine.PrefillUSPerToken > maxPrefillUSPerToken:
		return bad("engine.prefill_us_per_token = %d: want 0..%d (0: the default)", s.Engine.PrefillUSPerToken, maxPrefillUSPerToken)
	case !(s.Engine.DecodeMSPerToken >= 0 && s.Engine.DecodeMSPerToken <= maxDecodeMSPerToken): // NaN too
		return bad("engine.decode_ms_per_token = %v: want 0..%d (0: the default)", s.Engine.DecodeMSPerToken, maxDecodeMSPerToken)
	case s.Expect.FalseStallsMaxPct != nil && !(*s.Expect.FalseStallsMaxPct >= 0 && *s.Expect.FalseStallsMaxPct <= 100):
		return bad("expect.false_stalls_max_pct = %v: want 0..100", *s.Expect.FalseStallsMaxPct)
	case s.RetainS < 1 || s.RetainS > 3600:
		return bad("retain_s = %d: want 1..3600", s.RetainS)
	case s.Burn.Procs < 0 || s.Burn.Procs > 64:
		return bad("burn.procs = %d: want 0..64", s.Burn.Procs)
	}
	for name, sh := range s.Shapes {
		t, err := ParseTarget(name, s.Nodes)
		switch {
		case err != nil || t.Index < 0 || t.Part != "" || (t.Role != "prefill" && t.Role != "decode"):
			return bad("shapes: %q is not an engine node of the scenario (prefill-<i> or decode-<i>)", name)
		case sh.TP < 0 || sh.TP > 8:
			return bad("shapes.%s.tp = %d: want 1..8", name, sh.TP)
		case sh.BlockSize < 0 || sh.BlockSize > 1024:
			return bad("shapes.%s.block_size = %d: want 1..1024", name, sh.BlockSize)
		case sh.KVOrder != "" && sh.KVOrder != "nhd" && sh.KVOrder != "hnd" && sh.KVOrder != "cpu":
			return bad("shapes.%s.kv_order = %q: want nhd, hnd or cpu", name, sh.KVOrder)
		}
	}
	total := 0
	for _, f := range s.Faults {
		if err := f.check(s.Nodes); err != nil {
			return bad("line %d: %v", f.line, err)
		}
		at, every, timeout := time.Duration(f.At), time.Duration(f.Every), time.Duration(s.Timeout)
		if at >= timeout {
			return bad("line %d: at %s is past the scenario's timeout %s", f.line, at, timeout)
		}
		n := max(f.Times, 1)
		// The last repeat, at + (n-1)·every, without overflowing.
		if n > 1 && int64(n-1) > int64((timeout-at-1)/every) {
			return bad("line %d: %d repeats %s apart from %s run past the scenario's timeout %s", f.line, n, every, at, timeout)
		}
		if n > MaxFaults-total { // (not total+n: that can wrap)
			return bad("line %d: more than %d faults in all, repeats counted", f.line, MaxFaults)
		}
		total += n
	}
	return nil
}

// check refuses a fault its action cannot apply to its target, and a
// repeat that repeats nothing.
func (f Fault) check(nodes Nodes) error {
	switch {
	case f.Action == "":
		return errors.New("a fault without an action")
	case f.Times > 1 && f.Every <= 0:
		return fmt.Errorf("times = %d needs every (the interval)", f.Times)
	case f.Every > 0 && f.Times < 2:
		return fmt.Errorf("every = %s without times ≥ 2 repeats nothing", time.Duration(f.Every))
	}
	if f.Action == ActNATSRestart {
		if f.Target != "" && f.Target != "nats" {
			return fmt.Errorf("nats-restart targets nats, not %q", f.Target)
		}
		return nil
	}
	if f.Target == "" {
		return fmt.Errorf("%s needs a target", f.Action)
	}
	t, err := ParseTarget(f.Target, nodes)
	switch {
	case err != nil:
		return err
	case t.Role == "nats":
		return fmt.Errorf("%s of nats: the server is faulted only by nats-restart", f.Action)
	case (f.Action == ActPartition || f.Action == ActHeal) && t.Role == "router":
		return fmt.Errorf("%s of the router: its NATS link is the server's own (cut none)", f.Action)
	case (f.Action == ActPartition || f.Action == ActHeal) && t.Part != "":
		return fmt.Errorf("%s of %q: a partition cuts a node's whole link, name the node without /%s", f.Action, f.Target, t.Part)
	}
	return nil
}

// NeedsNATSProcess reports whether the scenario restarts NATS: then NATS
// runs as a process of its own instead of inside the router's connexd.
func (s *Scenario) NeedsNATSProcess() bool {
	for _, f := range s.Faults {
		if f.Action == ActNATSRestart {
			return true
		}
	}
	return false
}
