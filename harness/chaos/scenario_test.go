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
	ev.Expect = Expect{FalseStallsMaxPct: 50}
	ev.FalseResumes = map[string]int{"stalled": 1, "engine_left": 2}
	if v := Check(ev); len(v) != 0 {
		t.Fatalf("33%% false stalls against 50%%: %v", v)
	}
	ev.Expect.FalseStallsMaxPct = 30
	if v := Check(ev); len(v) != 1 || v[0].Invariant != InvFalseStalls || !strings.Contains(v[0].Detail, "1 of 3 requests (33.33%") {
		t.Fatalf("33%% false stalls against 30%%: %v", v)
	}
	ev.FalseResumes = nil
	if v := Check(ev); len(v) != 1 || v[0].Invariant != InvFalseStalls {
		t.Fatalf("unknown false resumes must not pass a bound: %v", v)
	}
	if sc, err := ParseScenario([]byte("expect: {false_stalls_max_pct: 1}\n")); err != nil || sc.Expect.FalseStallsMaxPct != 1 {
		t.Fatalf("false_stalls_max_pct: %+v, %v", sc.Expect, err)
	}
}
