package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// toolStream is what a streamed chat answer said about tool calls.
type toolStream struct {
	calls     map[int]*toolCall // by index
	content   string
	reasoning string // delta.reasoning (vLLM 0.32's name) and delta.reasoning_content
	// logprobs are the chosen tokens' (logprobs.content), in order.
	logprobs []chatLogprob
	finish   string
	errors   []string
	dones    int
	chunks   int
	// connex is the router's record of the answer (the usage chunk's).
	connex map[string]any
}

type chatLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Top     []struct {
		Token string `json:"token"`
	} `json:"top_logprobs"`
}

type toolCall struct {
	Name, Arguments string
	IDs             int // deltas that carried an id (one: the first)
}

// postToolStream posts a streamed chat request and merges its tool_calls
// deltas as an OpenAI client does; onChunk runs after each chunk.
func postToolStream(ctx context.Context, url string, body map[string]any, onChunk func(n int, header http.Header)) (*toolStream, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		var e bytes.Buffer
		_, _ = e.ReadFrom(resp.Body)
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, e.String())
	}
	s := &toolStream{calls: map[int]*toolCall{}}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			s.dones++
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content          string `json:"content"`
					Reasoning        string `json:"reasoning"`
					ReasoningContent string `json:"reasoning_content"`
					ToolCalls        []struct {
						Index    int    `json:"index"`
						ID       string `json:"id"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				Logprobs *struct {
					Content []chatLogprob `json:"content"`
				} `json:"logprobs"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Error *struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
			Connex map[string]any `json:"connex"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			return s, fmt.Errorf("chunk %q: %w", line, err)
		}
		if ch.Connex != nil {
			s.connex = ch.Connex
		}
		if ch.Error != nil {
			s.errors = append(s.errors, ch.Error.Code+": "+ch.Error.Message)
		}
		for _, c := range ch.Choices {
			if c.FinishReason != nil {
				s.finish = *c.FinishReason
			}
			s.content += c.Delta.Content
			s.reasoning += c.Delta.Reasoning + c.Delta.ReasoningContent
			if c.Logprobs != nil {
				s.logprobs = append(s.logprobs, c.Logprobs.Content...)
			}
			for _, tc := range c.Delta.ToolCalls {
				call := s.calls[tc.Index]
				if call == nil {
					call = &toolCall{}
					s.calls[tc.Index] = call
				}
				if tc.ID != "" {
					call.IDs++
				}
				call.Name += tc.Function.Name
				call.Arguments += tc.Function.Arguments
			}
			s.chunks++
			if onChunk != nil {
				onChunk(s.chunks, resp.Header)
			}
		}
	}
	return s, sc.Err()
}

// weatherTools is one tool the tiny model is made to call.
var weatherTools = []map[string]any{{"type": "function", "function": map[string]any{
	"name": "get_weather", "description": "the weather of a city",
	"parameters": map[string]any{"type": "object", "additionalProperties": false, "required": []string{"city", "days"},
		"properties": map[string]any{
			"city": map[string]any{"type": "string", "maxLength": 40},
			"days": map[string]any{"type": "array", "minItems": 12, "maxItems": 12, "items": map[string]any{"type": "integer", "minimum": 0, "maximum": 99}}}}}}}

func toolChat(prompt string, choice any) map[string]any {
	b := vllmChat(prompt, 400)
	delete(b, "ignore_eos")
	b["tools"], b["tool_choice"] = weatherTools, choice
	return b
}

// testVLLMTools (issue 43): a chat that calls a tool (tool_choice
// "required" and a named function: vLLM's chat layer forces the call's
// JSON and turns it into delta.tool_calls) through the router gives the
// client the same tool calls — name, arguments, finish_reason tool_calls —
// as one vLLM alone, streamed and not; its decode vLLM frozen mid-call, the
// router resumes it by replay into the same call, and a sampled, unseeded
// one too: the router seeds it.
func testVLLMTools(t *testing.T, c *localcluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	named := map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}
	replays := func() float64 {
		return sum(must2(scrapeAs(c.RouterURL()+"/metrics", c.AdminKey())), "connex_router_resume_replays_total")
	}
	for i, choice := range []any{"required", named} {
		t.Run(fmt.Sprintf("choice-%d", i), func(t *testing.T) {
			prompt := vllmPrompt(int64(500+i), 200)
			ref, err := postToolStream(ctx, engineURL(t, c, "decode-1")+"/v1/chat/completions", toolChat(prompt, choice), nil)
			if err != nil || ref.dones != 1 || len(ref.calls) == 0 {
				t.Fatalf("reference from vLLM alone: %v, %+v", err, ref)
			}
			got, err := postToolStream(ctx, c.RouterURL()+"/v1/chat/completions", toolChat(prompt, choice), nil)
			if err != nil || got.dones != 1 || len(got.errors) > 0 {
				t.Fatalf("through the router: %v, %+v", err, got)
			}
			if !reflect.DeepEqual(got.calls, ref.calls) || got.finish != ref.finish {
				t.Fatalf("tool calls through the router differ from vLLM alone's:\n got %s (finish %s)\nwant %s (finish %s)", dump(got.calls), got.finish, dump(ref.calls), ref.finish)
			}
			for idx, call := range got.calls {
				// The arguments are vLLM's (equal above): the tiny model's
				// strings may hold bytes JSON escapes, which vLLM's
				// grammar lets through, so they are not parsed here.
				if call.Name != "get_weather" || call.IDs != 1 || !strings.HasPrefix(call.Arguments, `{"city":`) {
					t.Fatalf("tool call %d: %+v: want get_weather with one id and its arguments object", idx, call)
				}
			}
			// Not streamed: message.tool_calls assembled by the router.
			body := toolChat(prompt, choice)
			body["stream"] = false
			delete(body, "stream_options")
			status, ans, err := postJSON(ctx, c.RouterURL()+"/v1/chat/completions", body)
			if err != nil || status != 200 {
				t.Fatalf("not streamed: %v %d %v", err, status, ans)
			}
			msg := ans["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
			calls, _ := msg["tool_calls"].([]any)
			if len(calls) != len(ref.calls) {
				t.Fatalf("not streamed: %d tool calls, want %d: %v", len(calls), len(ref.calls), msg)
			}
			for idx, raw := range calls {
				fn := raw.(map[string]any)["function"].(map[string]any)
				if fn["name"] != ref.calls[idx].Name || fn["arguments"] != ref.calls[idx].Arguments {
					t.Fatalf("not streamed: tool call %d %v, want %+v", idx, fn, ref.calls[idx])
				}
			}
			t.Logf("tool_choice %v: %d call(s) relayed, arguments %d bytes, finish %s", choice, len(got.calls), len(got.calls[0].Arguments), got.finish)
		})
	}
	// Frozen in the middle of the call's arguments, the request resumes by
	// replay on the other decode vLLM (its chat layer runs again over the
	// whole answer): the client's tool call equals vLLM alone's, with one
	// id.
	t.Run("frozen-mid-call-replayed", func(t *testing.T) {
		body := toolChat(vllmPrompt(510, 200), "required")
		ref, err := postToolStream(ctx, engineURL(t, c, "decode-1")+"/v1/chat/completions", body, nil)
		if err != nil || ref.dones != 1 || len(ref.calls) == 0 {
			t.Fatalf("reference from vLLM alone: %v, %+v", err, ref)
		}
		before := replays()
		got, victim := toolStreamFrozenAt(ctx, t, c, body, 12)
		if d := replays() - before; d != 1 {
			t.Fatalf("connex_router_resume_replays_total rose by %v, want 1: the freeze must land mid-call", d)
		}
		if got.dones != 1 || len(got.errors) != 0 || !reflect.DeepEqual(got.calls, ref.calls) || got.finish != ref.finish {
			t.Fatalf("resumed mid-call: %d [DONE], errors %v\n got %s (finish %s)\nwant %s (finish %s)", got.dones, got.errors, dump(got.calls), got.finish, dump(ref.calls), ref.finish)
		}
		t.Logf("%s frozen mid-call after 12 chunks: replayed, %d call(s) equal to vLLM alone's (arguments %d bytes)", victim, len(got.calls), len(got.calls[0].Arguments))
	})
	// A chat with logprobs frozen mid-answer resumes by replay: the same
	// content, and a logprob entry for each token once, the same tokens and
	// top tokens as vLLM alone's (the values within 1e-3: the replay
	// computes them again).
	t.Run("chat-logprobs-replayed", func(t *testing.T) {
		body := vllmChat(vllmPrompt(512, 200), 80)
		body["logprobs"], body["top_logprobs"] = true, 2
		ref, err := postToolStream(ctx, engineURL(t, c, "decode-1")+"/v1/chat/completions", body, nil)
		if err != nil || ref.dones != 1 || len(ref.logprobs) != 80 {
			t.Fatalf("reference from vLLM alone: %v, %d logprobs", err, len(ref.logprobs))
		}
		before := replays()
		got, victim := toolStreamFrozenAt(ctx, t, c, body, 20)
		if d := replays() - before; d != 1 {
			t.Fatalf("connex_router_resume_replays_total rose by %v, want 1: the freeze must land mid-answer", d)
		}
		if got.dones != 1 || len(got.errors) != 0 || got.content != ref.content || len(got.logprobs) != len(ref.logprobs) {
			t.Fatalf("resumed: %d [DONE], errors %v, %d logprobs (want %d)\n got %q\nwant %q", got.dones, got.errors, len(got.logprobs), len(ref.logprobs), got.content, ref.content)
		}
		worst := 0.0
		for i, lp := range got.logprobs {
			want := ref.logprobs[i]
			if lp.Token != want.Token || len(lp.Top) != len(want.Top) {
				t.Fatalf("logprob %d: %+v, want %+v", i, lp, want)
			}
			for j := range lp.Top {
				if lp.Top[j].Token != want.Top[j].Token {
					t.Fatalf("logprob %d's top %d: %q, want %q", i, j, lp.Top[j].Token, want.Top[j].Token)
				}
			}
			worst = max(worst, math.Abs(lp.Logprob-want.Logprob))
		}
		if worst > 1e-3 {
			t.Fatalf("a logprob differs from vLLM alone's by %g", worst)
		}
		t.Logf("%s frozen after 20 chunks: replayed, %d logprobs equal to vLLM alone's (largest difference %g)", victim, len(got.logprobs), worst)
	})
	// tool_choice auto with the tool parser: the tiny model answers in
	// text (it writes no call), which the parser must still read to the
	// end; frozen mid-answer, it is replayed into the same answer.
	t.Run("auto-frozen-replayed", func(t *testing.T) {
		body := toolChat(vllmPrompt(513, 200), "auto")
		ref, err := postToolStream(ctx, engineURL(t, c, "decode-1")+"/v1/chat/completions", body, nil)
		if err != nil || ref.dones != 1 || ref.chunks < 30 {
			t.Fatalf("reference from vLLM alone: %v, %+v: want an answer of 30 chunks or more", err, ref)
		}
		before := replays()
		got, victim := toolStreamFrozenAt(ctx, t, c, body, 20)
		if d := replays() - before; d != 1 {
			t.Fatalf("connex_router_resume_replays_total rose by %v, want 1: the freeze must land mid-answer", d)
		}
		if got.dones != 1 || len(got.errors) != 0 || got.content != ref.content || !reflect.DeepEqual(got.calls, ref.calls) || got.finish != ref.finish {
			t.Fatalf("resumed: %d [DONE], errors %v, finish %q (want %q)\n got %q %s\nwant %q %s", got.dones, got.errors, got.finish, ref.finish,
				got.content, dump(got.calls), ref.content, dump(ref.calls))
		}
		t.Logf("%s frozen after 20 chunks of a tool_choice auto answer: replayed, %d bytes of content and %d call(s) equal to vLLM alone's", victim, len(got.content), len(got.calls))
	})
	// Sampled without a seed, the router seeds the request (its answer's
	// connex record says the seed): frozen mid-call, it is replayed into the
	// same call the request with that seed gets uninterrupted.
	t.Run("sampled-mid-call-replayed", func(t *testing.T) {
		body := toolChat(vllmPrompt(511, 200), "required")
		body["temperature"] = 0.8
		before := replays()
		got, victim := toolStreamFrozenAt(ctx, t, c, body, 12)
		if d := replays() - before; d != 1 {
			t.Fatalf("connex_router_resume_replays_total rose by %v, want 1: the freeze must land mid-call", d)
		}
		seed, ok := got.connex["seed"].(float64)
		if got.dones != 1 || len(got.errors) != 0 || !ok {
			t.Fatalf("%d [DONE], errors %v, connex %v: want the replayed answer with the router's seed in its record", got.dones, got.errors, got.connex)
		}
		// The reference: the same request with that seed, uninterrupted,
		// through the router (a sampled answer through Connex and one
		// computed wholly by one engine may part where two tokens are
		// nearly tied: the decode engine computes the prompt's last token
		// alone, not in the prompt's batch).
		body["seed"] = int64(seed)
		ref, err := postToolStream(ctx, c.RouterURL()+"/v1/chat/completions", body, nil)
		if err != nil || ref.dones != 1 || len(ref.calls) == 0 || ref.connex["resumes"] != float64(0) {
			t.Fatalf("uninterrupted reference with seed %d: %v, %+v", int64(seed), err, ref)
		}
		if !reflect.DeepEqual(got.calls, ref.calls) || got.finish != ref.finish {
			t.Fatalf("resumed mid-call:\n got %s (finish %s)\nwant %s (finish %s), uninterrupted with seed %d", dump(got.calls), got.finish, dump(ref.calls), ref.finish, int64(seed))
		}
		t.Logf("%s frozen mid-call, sampled without a seed: the router seeded it (%d) and replayed it into the uninterrupted call (arguments %d bytes)", victim, int64(seed), len(got.calls[0].Arguments))
	})
}

// toolStreamFrozenAt streams a chat through the router (postToolStream)
// and SIGSTOPs its decode vLLM after n chunks; the engine is continued and
// waited for when the test ends.
func toolStreamFrozenAt(ctx context.Context, t *testing.T, c *localcluster.Cluster, body map[string]any, n int) (*toolStream, string) {
	t.Helper()
	var victim string
	got, err := postToolStream(ctx, c.RouterURL()+"/v1/chat/completions", body, func(i int, h http.Header) {
		if i == n {
			victim = h.Get("X-Connex-Decode-Engine")
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

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
