package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// vllmStructuredArgs are the test engines' structured-output settings:
// xgrammar with compact JSON, so that this random-weight model's JSON ends
// (with whitespace allowed it pads between values until max_tokens). vLLM
// takes compact JSON only with a named backend, not with auto (which would
// hand what xgrammar cannot compile to guidance); the connector's tests
// advance guidance and outlines grammars (tests/test_grammar_backends.py).
var vllmStructuredArgs = []string{"--structured-outputs-config", `{"backend":"xgrammar","disable_any_whitespace":true}`}

// structuredCase is one constrained request and how to check its answer.
type structuredCase struct {
	name, signal, path string
	body               func(prompt string) map[string]any
	// valid says whether a whole answer satisfies the client's constraint.
	valid func(text string) error
}

// grammarOf is the vLLM grammar class (its backend's) that a case's resumed
// engine's connector must name when it advances it.
var grammarOf = map[string]string{"json-SIGSTOP": "XgrammarGrammar"}

// intArray is a JSON schema: exactly n integers in [0, 999].
func intArray(n int) map[string]any {
	return map[string]any{"type": "array", "minItems": n, "maxItems": n,
		"items": map[string]any{"type": "integer", "minimum": 0, "maximum": 999}}
}

// validIntArray parses text as the array intArray(n) describes.
func validIntArray(n int) func(string) error {
	return func(text string) error {
		var xs []int
		if err := json.Unmarshal([]byte(text), &xs); err != nil {
			return fmt.Errorf("not a JSON array of integers: %v", err)
		}
		if len(xs) != n {
			return fmt.Errorf("%d items, the schema says %d", len(xs), n)
		}
		for _, x := range xs {
			if x < 0 || x > 999 {
				return fmt.Errorf("item %d is outside [0, 999]", x)
			}
		}
		return nil
	}
}

func matches(expr string) func(string) error {
	re := regexp.MustCompile(`^(?:` + expr + `)$`)
	return func(text string) error {
		if !re.MatchString(text) {
			return fmt.Errorf("does not match %s", expr)
		}
		return nil
	}
}

// structuredCompletion is a greedy streamed completion under a constraint;
// it ends when the constraint is complete (max is only a bound).
func structuredCompletion(prompt string, so map[string]any) map[string]any {
	b := vllmCompletion(prompt, 400)
	delete(b, "ignore_eos") // the grammar's end is the answer's end
	b["structured_outputs"] = so
	return b
}

// testVLLMStructured (issue 43): a structured request — structured_outputs
// regex / json / choice / grammar on completions, response_format
// json_schema on a chat — whose decode vLLM is SIGKILLed or SIGSTOPped
// mid-answer resumes on the other decode vLLM with its grammar where the
// dead engine left it: the answer equals one vLLM's serving it alone, token
// for token, satisfies the constraint, and cost one prefill. Before the
// fix the resumed engine started the grammar again from its root and the
// answer broke the constraint. Then a seeded sampler with logprobs resumes
// by replay, equal to vLLM alone, and a request neither a prefix resume nor
// a replay gives again (output penalties, unseeded) ends with one
// resume_refused error instead of a different answer.
func testVLLMStructured(t *testing.T, c *localcluster.Cluster, logs *safeBuffer) {
	prefillURL := engineURL(t, c, "prefill-0")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	const faultAt = 20
	word := `[a-z]{1,6}`
	choices := []string{
		"the river runs to the ocean under a blue sky and the forest reads one two three four five six seven",
		"the river runs to the ocean under a blue sky and the city writes three two one and the robot walks home",
	}
	grammar := `root ::= "[" item ("," item){29} "]"` + "\n" + `item ::= [a-z]{2,5}`
	cases := []structuredCase{
		{"regex-SIGKILL", "kill", "/v1/completions",
			func(p string) map[string]any {
				return structuredCompletion(p, map[string]any{"regex": "Answer:( " + word + "){50}\\."})
			},
			matches(`Answer:( ` + word + `){50}\.`)},
		{"json-SIGSTOP", "stop", "/v1/completions",
			func(p string) map[string]any { return structuredCompletion(p, map[string]any{"json": intArray(40)}) },
			validIntArray(40)},
		{"choice-SIGSTOP", "stop", "/v1/completions",
			func(p string) map[string]any { return structuredCompletion(p, map[string]any{"choice": choices}) },
			func(text string) error {
				if !slices.Contains(choices, text) {
					return fmt.Errorf("not one of the choices")
				}
				return nil
			}},
		{"grammar-SIGSTOP", "stop", "/v1/completions",
			func(p string) map[string]any { return structuredCompletion(p, map[string]any{"grammar": grammar}) },
			matches(`\[[a-z]{2,5}(,[a-z]{2,5}){29}\]`)},
		{"structural_tag-SIGSTOP", "stop", "/v1/completions",
			func(p string) map[string]any {
				tag, _ := json.Marshal(map[string]any{"type": "structural_tag", "format": map[string]any{"type": "sequence", "elements": []any{
					map[string]any{"type": "const_string", "value": "Answer: "},
					// A regex, not a json_schema: a structural tag's JSON allows
					// whitespace, which this random model pads with to max_tokens.
					map[string]any{"type": "regex", "pattern": `[a-z]{2,5}(,[a-z]{2,5}){29}\.`}}}})
				return structuredCompletion(p, map[string]any{"structural_tag": string(tag)})
			},
			matches(`Answer: [a-z]{2,5}(,[a-z]{2,5}){29}\.`)},
		{"chat-response_format-SIGKILL", "kill", "/v1/chat/completions",
			func(p string) map[string]any {
				b := vllmChat(p, 400)
				delete(b, "ignore_eos")
				b["response_format"] = map[string]any{"type": "json_schema",
					"json_schema": map[string]any{"name": "numbers", "schema": intArray(40)}}
				return b
			},
			validIntArray(40)},
	}
	routerMetric := func(name string) float64 {
		return sum(must2(scrapeAs(c.RouterURL()+"/metrics", c.AdminKey())), name)
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prompt := vllmPrompt(int64(300+i), 300)
			ref, err := postStream(ctx, engineURL(t, c, "decode-0")+tc.path, tc.body(prompt), nil)
			if err != nil || ref.status != 200 || ref.dones != 1 || len(ref.errors) > 0 {
				t.Fatalf("reference from vLLM alone: %v, status %d %s, errors %v", err, ref.status, ref.body, ref.errors)
			}
			if err := tc.valid(ref.text()); err != nil {
				t.Fatalf("vLLM alone's answer %q: %v (the constraint is not what the test thinks)", ref.text(), err)
			}
			if len(ref.ids) < faultAt+10 {
				t.Fatalf("vLLM alone's answer has %d tokens: too short to fault at %d", len(ref.ids), faultAt)
			}
			prefillDone := vllmMetric(t, prefillURL, "vllm:request_success_total")
			resumes := routerMetric("connex_router_resumes_total")
			var victim string
			var faultErr error
			got, err := postStream(ctx, c.RouterURL()+tc.path, tc.body(prompt), func(n int, s *streamed) {
				if n != faultAt {
					return
				}
				victim = s.header.Get("X-Connex-Decode-Engine")
				if tc.signal == "kill" {
					faultErr = c.Kill(victim + "/engine")
				} else {
					faultErr = c.Stop(victim + "/engine")
					t.Cleanup(func() { _ = c.Cont(victim + "/engine") })
				}
			})
			if victim != "" {
				defer bringBack(ctx, t, c, tc.signal, victim)
			}
			if err != nil || faultErr != nil || victim == "" {
				t.Fatalf("stream: %v; fault on %q: %v", err, victim, faultErr)
			}
			if got.status != 200 || got.dones != 1 || len(got.errors) > 0 {
				t.Fatalf("after %s of %s: status %d %s, %d [DONE], errors %v", tc.signal, victim, got.status, got.body, got.dones, got.errors)
			}
			if d := routerMetric("connex_router_resumes_total") - resumes; d != 1 {
				t.Fatalf("the router resumed %v times, want 1 (the fault after %d of %d tokens must land mid-answer)", d, faultAt, len(ref.ids))
			}
			if err := tc.valid(got.text()); err != nil {
				t.Fatalf("the resumed answer breaks the client's constraint: %v\n got %q\nwant %q", err, got.text(), ref.text())
			}
			if fmt.Sprint(got.ids) != fmt.Sprint(ref.ids) || got.text() != ref.text() {
				t.Fatalf("the resumed answer differs from vLLM alone:\n got %q\nwant %q", got.text(), ref.text())
			}
			if d := vllmMetric(t, prefillURL, "vllm:request_success_total") - prefillDone; d != 1 {
				t.Fatalf("the prefill vLLM finished %v requests for one client request, want exactly 1", d)
			}
			advanced := lastLine(logs.String(), "", "its structured-output grammar goes on")
			if g := grammarOf[tc.name]; g != "" && !strings.Contains(advanced, "("+g+",") {
				t.Fatalf("the resumed engine's connector logged %q: want it to advance a %s", advanced, g)
			}
			t.Logf("%s of %s after %d of %d tokens: the resumed answer equals vLLM alone's and satisfies the constraint (%s)",
				tc.signal, victim, faultAt, len(ref.ids), advanced)
		})
	}

	// A seeded sampler would restart on a prefix resume: the router
	// resumes the request by replay (the resumed engine generates it again
	// from its first token with the same seed) and the client gets the
	// seeded answer whole. Unseeded, with output penalties, neither gives
	// the answer again: the router ends it where it is.
	t.Run("seeded-replayed-SIGSTOP", func(t *testing.T) {
		body := vllmCompletion(vllmPrompt(399, 300), 120)
		body["temperature"], body["seed"], body["logprobs"] = 0.8, 7, 2
		ref, err := postStream(ctx, engineURL(t, c, "decode-1")+"/v1/completions", body, nil)
		if err != nil || ref.status != 200 || len(ref.ids) != 120 {
			t.Fatalf("reference: %v %d %s", err, ref.status, ref.body)
		}
		replays := routerMetric("connex_router_resume_replays_total")
		got, victim := streamFrozenAt(ctx, t, c, "/v1/completions", body, faultAt)
		if got.status != 200 || got.dones != 1 || len(got.errors) != 0 {
			t.Fatalf("status %d %s, %d [DONE], errors %v", got.status, got.body, got.dones, got.errors)
		}
		if !slices.Equal(got.ids, ref.ids) || got.text() != ref.text() {
			t.Fatalf("the replayed answer differs from the seeded reference:\n got %q\nwant %q", got.text(), ref.text())
		}
		if d := routerMetric("connex_router_resume_replays_total") - replays; d != 1 {
			t.Fatalf("connex_router_resume_replays_total grew by %v, want 1", d)
		}
		t.Logf("seeded sampler with logprobs, %s frozen after %d tokens: replayed, %d tokens equal to vLLM alone's", victim, faultAt, len(got.ids))
	})
	// Unseeded with a presence penalty: the router seeds it, and frozen
	// mid-stream it is replayed into the answer the request with that seed
	// gets uninterrupted.
	t.Run("penalty-unseeded-replayed-SIGSTOP", func(t *testing.T) {
		body := vllmCompletion(vllmPrompt(398, 300), 120)
		body["temperature"], body["presence_penalty"] = 0.8, 0.5
		replays := routerMetric("connex_router_resume_replays_total")
		got, _ := streamFrozenAt(ctx, t, c, "/v1/completions", body, faultAt)
		if got.status != 200 || got.dones != 1 || len(got.errors) != 0 || len(got.ids) != 120 {
			t.Fatalf("status %d %s, %d [DONE], %d tokens, errors %v: want the whole answer, replayed", got.status, got.body, got.dones, len(got.ids), got.errors)
		}
		if d := routerMetric("connex_router_resume_replays_total") - replays; d != 1 {
			t.Fatalf("connex_router_resume_replays_total grew by %v, want 1", d)
		}
		seed, ok := got.connex["seed"].(float64)
		if !ok {
			t.Fatalf("the answer's connex record %v has no seed", got.connex)
		}
		// The reference: the same request with that seed, uninterrupted,
		// through the router (see testVLLMTools' sampled case).
		body["seed"] = int64(seed)
		ref, err := postStream(ctx, c.RouterURL()+"/v1/completions", body, nil)
		if err != nil || ref.status != 200 || ref.connex["resumes"] != float64(0) || !slices.Equal(got.ids, ref.ids) {
			t.Fatalf("uninterrupted with seed %d: %v, status %d, record %v\n got %v\nwant %v", int64(seed), err, ref.status, ref.connex, got.ids, ref.ids)
		}
		t.Logf("unseeded sampler with a presence penalty, frozen after %d tokens: seeded (%d), replayed, %d tokens equal to the uninterrupted answer with that seed", faultAt, int64(seed), len(got.ids))
	})
}

// streamFrozenAt streams body through the router and SIGSTOPs its decode
// vLLM after n chunks; the engine is continued and waited for afterwards.
func streamFrozenAt(ctx context.Context, t *testing.T, c *localcluster.Cluster, path string, body map[string]any, n int) (*streamed, string) {
	t.Helper()
	var victim string
	got, err := postStream(ctx, c.RouterURL()+path, body, func(i int, s *streamed) {
		if i == n {
			victim = s.header.Get("X-Connex-Decode-Engine")
			if err := c.Stop(victim + "/engine"); err != nil {
				t.Error(err)
			}
		}
	})
	if victim != "" {
		if err := c.Cont(victim + "/engine"); err != nil {
			t.Error(err)
		}
		t.Cleanup(func() { waitEnginesFor(t, c, 2*time.Minute) })
	}
	if err != nil || victim == "" {
		t.Fatalf("stream: %v (victim %q)", err, victim)
	}
	return got, victim
}
