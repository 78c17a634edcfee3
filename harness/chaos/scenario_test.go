package chaos

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseScenario(t *testing.T) {
	sc, err := ParseScenario([]byte(`
seed: 3
timeout: 90s
nodes: {prefill: 1, decode: 3}
engine: {prefill_us_per_token: 20, decode_ms_per_token: 5}
load: {requests: 10, concurrency: 2, prompt_tokens: 32, max_tokens: 16, stream: true, chat: 0.5}
faults:
  - {at: 1s, action: kill, target: decode-any}
  - {at: 2s, action: restart, target: decode-2/engine}
  - {at: 3s, action: nats-restart}
`))
	if err != nil {
		t.Fatal(err)
	}
	if sc.Seed != 3 || time.Duration(sc.Timeout) != 90*time.Second || sc.Nodes.Decode != 3 || sc.Load.Stream != 1 || sc.Load.Chat != 0.5 || len(sc.Faults) != 3 || !sc.NeedsNATSProcess() {
		t.Fatalf("parsed %+v", sc)
	}
	if sc.RetainS != 10 || sc.Nodes.Prefill != 1 {
		t.Fatalf("defaults: %+v", sc)
	}
	shaped, err := ParseScenario([]byte("shapes:\n  prefill-0: {tp: 2, block_size: 32, kv_order: hnd}\n  decode-1: {tp: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(shaped.Shapes["prefill-0"].SimArgs(), " "); got != "--tp 2 --block-size 32 --kv-order hnd" {
		t.Fatalf("prefill-0's connex-sim flags: %q", got)
	}
	if got := shaped.Shapes["decode-0"].SimArgs(); len(got) != 0 {
		t.Fatalf("an engine without a shape gets flags %q", got)
	}
	for _, c := range []struct{ yaml, want string }{
		{"seed: 1\nnodez: {decode: 2}\n", "line 2: field nodez not found"},
		{"load:\n  requests: 5\n  concurency: 2\n", "line 3: field concurency not found"},
		{"faults:\n  - {at: 1s, action: explode, target: decode-0}\n", `line 2: unknown action "explode"`},
		{"faults:\n  - {at: 1s, action: kill, target: decode-0, when: now}\n", "line 2: field when not found"},
		{"faults:\n  - {at: soon, action: kill, target: decode-0}\n", `line 2: "soon" is not a duration`},
		{"nodes: {decode: 2}\nfaults:\n  - {at: 1s, action: kill, target: decode-2}\n", "line 3: target \"decode-2\": the scenario has 2 decode node(s)"},
		{"faults:\n  - {at: 1s, action: kill, target: decode-0/gpu}\n", "line 2: target \"decode-0/gpu\""},
		{"faults:\n  - {at: 1s, action: kill}\n", "line 2: kill needs a target"},
		{"faults:\n  - {at: 1s, action: nats-restart, target: router}\n", "line 2: nats-restart targets nats"},
		{"load: {stream: 2}\n", `line 1: "2": want true, false or a share`},
		{"timeout: 10s\nfaults:\n  - {at: 20s, action: kill, target: decode-0}\n", "past the scenario's timeout"},
		{"", "the file is empty"},
		{"seed: [1\n", "bad scenario"},
		{"shapes:\n  decode-5: {tp: 2}\n", `shapes: "decode-5" is not an engine node`},
		{"shapes:\n  router: {tp: 2}\n", `shapes: "router" is not an engine node`},
		{"shapes:\n  decode-0: {tp: 16}\n", "shapes.decode-0.tp = 16"},
		{"shapes:\n  decode-0: {kv_order: chw}\n", `shapes.decode-0.kv_order = "chw"`},
		{"shapes:\n  decode-0: {tp: 2, heads: 4}\n", "field heads not found"},
	} {
		_, err := ParseScenario([]byte(c.yaml))
		if !errors.Is(err, ErrScenario) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an ErrScenario naming %q", c.yaml, err, c.want)
		}
	}
}

// TestShippedScenariosParse: every scenario in harness/chaos/scenarios is valid.
func TestShippedScenariosParse(t *testing.T) {
	files, err := filepath.Glob("scenarios/*.yaml")
	if err != nil || len(files) < 5 {
		t.Fatalf("scenarios: %v %v", files, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseScenario(data); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestFleetPicksApplicableTargets: "-any" targets pick a node the action
// applies to, and a fault nothing applies to is skipped with the reason.
func TestFleetPicksApplicableTargets(t *testing.T) {
	n := Nodes{Prefill: 1, Decode: 2}
	f := newFleet(n)
	rng := rand.New(rand.NewPCG(1, 2))
	any := Target{Role: "decode", Index: -1}
	first, ok, _ := f.resolve(rng, ActKill, any)
	if !ok {
		t.Fatal("kill decode-any found nothing")
	}
	second, ok, _ := f.resolve(rng, ActKill, any)
	if !ok || second == first {
		t.Fatalf("the second kill hit %q (first %q), want the other node", second, first)
	}
	if _, ok, why := f.resolve(rng, ActKill, any); ok || why == "" {
		t.Fatalf("a third kill with every decode node down: ok=%v why=%q", ok, why)
	}
	got, ok, _ := f.resolve(rng, ActRestart, any)
	if !ok || (got != first && got != second) {
		t.Fatalf("restart decode-any: %q %v", got, ok)
	}
	if _, ok, _ := f.resolve(rng, ActCont, Target{Role: "decode", Index: -1, Part: "connexd"}); ok {
		t.Fatal("cont with nothing stopped was not skipped")
	}
	if got, ok, _ := f.resolve(rng, ActStop, Target{Role: "prefill", Index: 0, Part: "connexd"}); !ok || got != "prefill-0/connexd" {
		t.Fatalf("stop prefill-0/connexd: %q %v", got, ok)
	}
	if faulted := f.faulted(); faulted["prefill-0/connexd"] != stopped || len(faulted) != 3 {
		t.Fatalf("faulted: %v", faulted)
	}
}

// TestCheckNamesTheBrokenInvariant: each invariant, broken alone in
// synthetic evidence, is reported with the requests it concerns; the
// same evidence intact passes.
func TestCheckNamesTheBrokenInvariant(t *testing.T) {
	good := func() Evidence {
		return Evidence{
			Records: []*Record{
				{N: 0, RequestID: "r0", Prompt: 0, Text: "abc", Prefills: 1, PrefillEngine: "prefill-0", Start: 0, End: time.Second},
				{N: 1, RequestID: "r1", Prompt: 1, Text: "xyz", Prefills: 1, Resumes: 1, PrefillEngine: "prefill-0", Stream: true, MaxGap: 40 * time.Millisecond, Start: time.Second, End: 2 * time.Second},
				{N: 2, RequestID: "r2", Prompt: 1, Err: "HTTP 503: no live decode engine (code no_engine)", Status: 503},
			},
			Reference: map[refKey]string{{0, false}: "abc", {1, false}: "xyz"},
			Freed:     map[string]int{"t0": 1, "t1": 1},
		}
	}
	if v := Check(good()); len(v) != 0 {
		t.Fatalf("intact evidence: %v", v)
	}
	s := Summarize(good())
	if s.Completed != 2 || s.Failed != 1 || s.Resumed != 1 || s.FailoverMsP50 != 40 || s.Prefills != 2 {
		t.Fatalf("summary: %+v", s)
	}
	for _, c := range []struct {
		name   string
		break_ func(*Evidence)
		inv    string
		req    string
	}{
		{"lost", func(e *Evidence) { e.Records[0].Lost, e.Records[0].Err = true, "stream ended without [DONE]" }, InvNothingLost, "r0"},
		{"an error without a message", func(e *Evidence) { e.Records[2].Err = " " }, InvNothingLost, "r2"},
		{"a dropped token", func(e *Evidence) { e.Records[1].Text = "xz" }, InvSameAnswer, "r1"},
		{"a second prefill", func(e *Evidence) { e.Records[1].Prefills = 2 }, InvNoSecondPrefill, "r1"},
		{"a double free", func(e *Evidence) { e.Freed["t1"] = 2 }, InvExactlyOnceFree, "t1 (freed 2 times)"},
		{"a double-free counter", func(e *Evidence) { e.DoubleFrees = map[string]int{"prefill-0/connexd": 1} }, InvExactlyOnceFree, ""},
		{"a leaked hold", func(e *Evidence) { e.Live = map[string]uint32{"t9": 4} }, InvNoLeak, "t9"},
	} {
		ev := good()
		c.break_(&ev)
		v := Check(ev)
		if len(v) != 1 || v[0].Invariant != c.inv || (c.req != "" && !strings.Contains(strings.Join(v[0].Requests, ","), c.req)) {
			t.Errorf("%s: %v, want one %q violation naming %q", c.name, v, c.inv, c.req)
		}
	}
	// A second prefill is allowed when the prefill node was down meanwhile.
	ev := good()
	ev.Records[1].Prefills = 2
	ev.Down = []faultWindow{{node: "prefill-0", from: 1500 * time.Millisecond, till: 3 * time.Second}}
	if v := Check(ev); len(v) != 0 {
		t.Fatalf("a second prefill after the prefill node was killed: %v", v)
	}
	// A refused connection while the router was down failed visibly; the
	// same outside a router fault is lost.
	ev = good()
	ev.Records[2] = &Record{N: 2, Lost: true, Transport: true, Err: "no answer: connection refused", Start: 5 * time.Second, End: 5 * time.Second}
	if v := Check(ev); len(v) != 1 || v[0].Invariant != InvNothingLost {
		t.Fatalf("a refused connection with the router up: %v", v)
	}
	ev.Down = []faultWindow{{node: "router", from: 4 * time.Second, till: 6 * time.Second}}
	if v := Check(ev); len(v) != 0 {
		t.Fatalf("a refused connection while the router was down: %v", v)
	}
	if s := Summarize(ev); s.Lost != 0 || s.Failed != 1 {
		t.Fatalf("summary with the router down: %+v", s)
	}
}

// TestExpectChecks: a scenario's expect block turns a clear error or a
// resume, which the invariants allow, into a violation naming the requests
// (and, for errors, what they said), and burn/expect parse strictly.
func TestExpectChecks(t *testing.T) {
	sc, err := ParseScenario([]byte("burn: {procs: 4}\nexpect: {no_errors: true, no_resumes: true}\n"))
	if err != nil || sc.Burn.Procs != 4 || !sc.Expect.NoErrors || !sc.Expect.NoResumes {
		t.Fatalf("parsed %+v, %v", sc, err)
	}
	for _, c := range []struct{ yaml, want string }{
		{"burn: {procs: -1}\n", "burn.procs = -1"},
		{"burn: {cores: 2}\n", "field cores not found"},
		{"expect: {no_lost: true}\n", "field no_lost not found"},
	} {
		if _, err := ParseScenario([]byte(c.yaml)); !errors.Is(err, ErrScenario) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an ErrScenario naming %q", c.yaml, err, c.want)
		}
	}
	ev := Evidence{
		Records: []*Record{
			{N: 0, RequestID: "r0", Text: "abc", Prefills: 1},
			{N: 1, RequestID: "r1", Text: "abc", Prefills: 1, Resumes: 1},
			{N: 2, RequestID: "r2", Err: "HTTP 503: no live decode engine (code no_engine)", Status: 503},
		},
		Reference: map[refKey]string{{0, false}: "abc"},
	}
	if v := Check(ev); len(v) != 0 {
		t.Fatalf("without expect, a clear error and a resume are allowed: %v", v)
	}
	ev.Expect = Expect{NoErrors: true, NoResumes: true}
	v := Check(ev)
	if len(v) != 2 || v[0].Invariant != InvNoErrors || v[1].Invariant != InvNoResumes {
		t.Fatalf("with expect: %v", v)
	}
	if v[0].Requests[0] != "r2" || !strings.Contains(v[0].Detail, "1× HTTP 503: no live decode engine") || v[1].Requests[0] != "r1" {
		t.Fatalf("violations do not name the requests and errors: %v", v)
	}
	// False stalls: 1 of 3 requests is 33 %; engine_left ones do not count.
	pct := func(v float64) *float64 { return &v }
	ev.Expect = Expect{FalseStallsMaxPct: pct(50)}
	ev.FalseResumes = map[string]int{"stalled": 1, "engine_left": 2}
	if v := Check(ev); len(v) != 0 {
		t.Fatalf("33%% false stalls against 50%%: %v", v)
	}
	ev.Expect.FalseStallsMaxPct = pct(30)
	if v := Check(ev); len(v) != 1 || v[0].Invariant != InvFalseStalls || !strings.Contains(v[0].Detail, "1 of 3 requests (33.33%") {
		t.Fatalf("33%% false stalls against 30%%: %v", v)
	}
	ev.FalseResumes = nil
	if v := Check(ev); len(v) != 1 || v[0].Invariant != InvFalseStalls {
		t.Fatalf("unknown false resumes must not pass a bound: %v", v)
	}
	if sc, err := ParseScenario([]byte("expect: {false_stalls_max_pct: 1}\n")); err != nil || *sc.Expect.FalseStallsMaxPct != 1 {
		t.Fatalf("false_stalls_max_pct: %+v, %v", sc.Expect, err)
	}
	// 0 allows no false stall at all (it is not "unset").
	ev.FalseResumes = map[string]int{"stalled": 1}
	ev.Expect.FalseStallsMaxPct = pct(0)
	if v := Check(ev); len(v) != 1 || v[0].Invariant != InvFalseStalls {
		t.Fatalf("one false stall against 0%%: %v", v)
	}
}

// TestCheckFaultsAndTime: a fault that could not be applied, and a run
// its timeout ended, break the run and say which and why.
func TestCheckFaultsAndTime(t *testing.T) {
	ev := Evidence{Faults: []FaultReport{
		{At: time.Second, Action: ActKill, Target: "decode-any", Resolved: "decode-1"},
		{At: 2 * time.Second, Action: ActRestart, Target: "decode-any", Skipped: "nothing killed"},
	}}
	if v := Check(ev); len(v) != 0 {
		t.Fatalf("applied and skipped faults: %v", v)
	}
	ev.Faults = append(ev.Faults, FaultReport{At: 3 * time.Second, Action: ActRestart, Target: "decode-1", Error: "not ready within 60s"})
	ev.OutOfTime = true
	v := Check(ev)
	if len(v) != 2 || v[0].Invariant != InvFaultsApplied || !strings.Contains(v[0].Detail, "restart decode-1 at 3s: not ready within 60s") || v[1].Invariant != InvInTime {
		t.Fatalf("a failed fault and a run out of time: %v", v)
	}
}

// TestScenarioBounds: values that would make the harness allocate without
// end, overflow or test nothing are refused with the field that is wrong.
func TestScenarioBounds(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"faults:\n  - {at: 0s, action: kill, target: decode-0, every: 1ns, times: 2000000000}\n", "more than 10000 faults"},
		{"timeout: 2562047h47m16.854775807s\nfaults:\n  - {at: 0s, action: kill, target: decode-0}\n  - {at: 0s, action: cont, target: decode-0, every: 1ns, times: 9223372036854775807}\n", "line 4: more than 10000 faults"},
		{"faults:\n  - {at: 1s, action: kill, target: decode-0, every: 2000000h, times: 3}\n", "3 repeats 2000000h0m0s apart from 1s run past"},
		{"timeout: 1m\nfaults:\n  - {at: 10s, action: kill, target: decode-0, every: 20s, times: 4}\n", "4 repeats 20s apart from 10s run past the scenario's timeout 1m0s"},
		{"faults:\n  - {at: 1s, action: nats-restart, times: 5}\n", "times = 5 needs every"},
		{"timeout: 1m\nfaults:\n  - {at: 1h, action: nats-restart}\n", "line 3: at 1h0m0s is past the scenario's timeout"},
		{"faults:\n  - {at: 1s, action: kill, target: decode-0, every: 2s}\n", "every = 2s without times ≥ 2"},
		{"faults:\n  - {at: 1s, action: kill, target: decode-0, every: 2s, times: 1}\n", "every = 2s without times ≥ 2"},
		{"faults:\n  - {at: 1s, action: kill, action: stop, target: decode-0}\n", "line 2: field action given twice"},
		{"faults:\n  - {at: 1s, action: kill, target: nats}\n", "kill of nats"},
		{"faults:\n  - {at: 1s, action: partition, target: router}\n", "partition of the router"},
		{"faults:\n  - {at: 1s, action: heal, target: decode-0/engine}\n", `heal of "decode-0/engine"`},
		{"faults:\n  - {at: 1s}\n", "a fault without an action"},
		{"faults:\n  - kill decode-0\n", "a fault is a mapping"},
		{"load: {requests: 9223372036854775807}\n", "load.requests = 9223372036854775807"},
		{"load: {requests: -1}\n", "load.requests = -1"},
		{"load: {concurrency: 257}\n", "load.concurrency = 257"},
		{"load: {prompt_tokens: 9223372036854775807, max_tokens: 9223372036854775807}\n", "want both ≥ 1 and their sum ≤ 16384"},
		{"load: {prompt_tokens: 16000, max_tokens: 400}\n", "load.prompt_tokens = 16000, load.max_tokens = 400"},
		{"load: {prompt_tokens: -4}\n", "load.prompt_tokens = -4"},
		{"engine: {prefill_us_per_token: 9223372036854775807}\n", "engine.prefill_us_per_token = 9223372036854775807"},
		{"engine: {prefill_us_per_token: -1}\n", "engine.prefill_us_per_token = -1"},
		{"engine: {decode_ms_per_token: .inf}\n", "engine.decode_ms_per_token = +Inf"},
		{"engine: {decode_ms_per_token: .nan}\n", "engine.decode_ms_per_token = NaN"},
		{"expect: {false_stalls_max_pct: 101}\n", "expect.false_stalls_max_pct = 101"},
		{"expect: {false_stalls_max_pct: -1}\n", "expect.false_stalls_max_pct = -1"},
		{"nodes: {prefill: 9}\n", "nodes.prefill = 9"},
		{"nodes: {decode: -1}\n", "nodes.decode = -1"},
		{"retain_s: 4000\n", "retain_s = 4000"},
		{"timeout: -1s\n", `"-1s" is not a duration`},
		{"shapes:\n  decode-0: {block_size: 2048}\n", "shapes.decode-0.block_size = 2048"},
		{"shapes:\n  decode-any: {tp: 2}\n", `shapes: "decode-any" is not an engine node`},
		{"seed: 1\n---\nseed: 2\n", "line 3: a second YAML document"},
	} {
		_, err := ParseScenario([]byte(c.yaml))
		if !errors.Is(err, ErrScenario) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an ErrScenario naming %q", c.yaml, err, c.want)
		}
	}
	// At the bounds, accepted.
	if _, err := ParseScenario([]byte("timeout: 1m\nload: {prompt_tokens: 16000, max_tokens: 384}\nfaults:\n  - {at: 10s, action: kill, target: decode-0, every: 16s, times: 4}\n")); err != nil {
		t.Fatalf("a scenario at its bounds: %v", err)
	}
}
