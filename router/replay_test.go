package router

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// scriptedEngine is a decode engine whose leg streams given chunks (the
// data of each event); a leg whose script does not end with "[DONE]"
// breaks after its last chunk. Leg i plays legs[min(i, len-1)].
type scriptedEngine struct {
	id        string
	legs      [][]string
	reasoning string // the reasoning parser it registers

	mu     sync.Mutex
	bodies []map[string]any
	paths  []string
	srv    *httptest.Server
}

func (f *scriptedEngine) start(t *testing.T) *scriptedEngine {
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Errorf("%s: body: %v", f.id, err)
			return
		}
		f.mu.Lock()
		leg := f.legs[min(len(f.bodies), len(f.legs)-1)]
		f.bodies = append(f.bodies, body)
		f.paths = append(f.paths, r.URL.Path)
		f.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for _, data := range leg {
			fmt.Fprintf(w, "data: %s\n\n", data)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *scriptedEngine) fake() *fakeEngine {
	return &fakeEngine{id: f.id, role: "decode", srv: f.srv, reasoning: f.reasoning}
}

// chatChunk is a chat chunk's data: a delta (JSON) and token ids.
func chatChunk(delta string, ids ...int) string {
	b, _ := json.Marshal(ids)
	return fmt.Sprintf(`{"choices":[{"index":0,"delta":%s,"token_ids":%s,"finish_reason":null}]}`, delta, b)
}

func finishChunk(reason string) string {
	return fmt.Sprintf(`{"choices":[{"index":0,"delta":{},"finish_reason":%q}]}`, reason)
}

// clientChat is what a client makes of a streamed chat: content,
// reasoning, tool calls merged by index (and how many deltas named an id
// and a name), logprob tokens, ids, finish reason, errors, [DONE]s.
type clientChat struct {
	content, reasoning string
	calls              map[int]*clientCall
	logprobTokens      []string
	ids                []int
	finish             string
	errs               []string
	dones              int
}

type clientCall struct {
	ids, names int
	id, name   string
	args       string
}

func postChat(t *testing.T, url, body string) *clientChat {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		data, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	a := &clientChat{calls: map[int]*clientCall{}}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			a.dones++
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content   string `json:"content"`
					Reasoning string `json:"reasoning"`
					ToolCalls []struct {
						Index    int    `json:"index"`
						ID       string `json:"id"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				Logprobs *struct {
					Content []struct {
						Token string `json:"token"`
					} `json:"content"`
				} `json:"logprobs"`
				TokenIDs     []int   `json:"token_ids"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Error map[string]any `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			t.Fatalf("chunk %q: %v", line, err)
		}
		if ch.Error != nil {
			a.errs = append(a.errs, fmt.Sprint(ch.Error["code"], ": ", ch.Error["message"]))
		}
		for _, c := range ch.Choices {
			a.content += c.Delta.Content
			a.reasoning += c.Delta.Reasoning
			for _, tc := range c.Delta.ToolCalls {
				call := a.calls[tc.Index]
				if call == nil {
					call = &clientCall{}
					a.calls[tc.Index] = call
				}
				if tc.ID != "" {
					call.ids++
					call.id = tc.ID
				}
				if tc.Function.Name != "" {
					call.names++
					call.name = tc.Function.Name
				}
				call.args += tc.Function.Arguments
			}
			if c.Logprobs != nil {
				for _, lp := range c.Logprobs.Content {
					a.logprobTokens = append(a.logprobTokens, lp.Token)
				}
			}
			a.ids = append(a.ids, c.TokenIDs...)
			if c.FinishReason != nil {
				a.finish = *c.FinishReason
			}
		}
	}
	return a
}

func toolHeader(id string) string {
	return fmt.Sprintf(`{"tool_calls":[{"index":0,"id":%q,"type":"function","function":{"name":"get_weather","arguments":""}}]}`, id)
}

func toolArgs(s string) string {
	b, _ := json.Marshal(s)
	return fmt.Sprintf(`{"tool_calls":[{"index":0,"function":{"arguments":%s}}]}`, b)
}

const toolChatBody = `{"model":"m","messages":[{"role":"user","content":"weather?"}],"max_tokens":20,"stream":true,"temperature":0,` +
	`"return_token_ids":true,"tools":[{"type":"function","function":{"name":"get_weather"}}],"tool_choice":"required"}`

// TestReplayResumesAToolCall: a chat with tools whose decode engine breaks
// in the middle of a tool call's arguments resumes by replay: the other
// engine gets the client's chat again (tools, messages, the chat endpoint)
// and generates it again, its parser chunking the call otherwise (the
// header and the first arguments in one delta, another call id); the
// client gets the call once — one id, one name, the arguments whole — and
// every token id once.
func TestReplayResumesAToolCall(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&scriptedEngine{id: "d1", legs: [][]string{{
		chatChunk(`{"role":"assistant","content":""}`),
		chatChunk(`{}`, 1000),
		chatChunk(toolHeader("call_a"), 1001),
		chatChunk(toolArgs(`{"city": "Pa`), 1002, 1003),
		chatChunk(toolArgs(`ris", "days`), 1004),
		// breaks
	}}}).start(t)
	d2 := (&scriptedEngine{id: "d2", legs: [][]string{{
		chatChunk(`{"role":"assistant","content":""}`),
		chatChunk(`{}`, 1000, 1001),
		chatChunk(`{"tool_calls":[{"index":0,"id":"call_b","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\""}}]}`, 1002, 1003),
		chatChunk(toolArgs(`, "days": [1, 2]}`), 1004, 1005, 1006),
		finishChunk("tool_calls"),
		"[DONE]",
	}}}).start(t)
	s := newTestRouter(t, p, d1.fake(), d2.fake())
	a := postChat(t, s.URL()+"/v1/chat/completions", toolChatBody)
	if a.dones != 1 || len(a.errs) != 0 {
		t.Fatalf("%d [DONE], errors %v", a.dones, a.errs)
	}
	c := a.calls[0]
	if len(a.calls) != 1 || c.ids != 1 || c.id != "call_a" || c.names != 1 || c.name != "get_weather" || c.args != `{"city": "Paris", "days": [1, 2]}` {
		t.Fatalf("tool calls %+v: want get_weather once, with call_a and the whole arguments", c)
	}
	if fmt.Sprint(a.ids) != "[1000 1001 1002 1003 1004 1005 1006]" || a.finish != "tool_calls" || a.content != "" {
		t.Fatalf("ids %v finish %q content %q", a.ids, a.finish, a.content)
	}
	if len(d2.bodies) != 1 || d2.paths[0] != "/v1/chat/completions" || d2.bodies[0]["tools"] == nil || d2.bodies[0]["messages"] == nil {
		t.Fatalf("the replayed leg went to %v with %v: want the client's chat again", d2.paths, d2.bodies)
	}
	if n := counted(t, s, "connex_router_resume_replays_total"); n != 1 {
		t.Fatalf("connex_router_resume_replays_total = %v, want 1", n)
	}

	// Not streamed: the router's assembled message holds the call once.
	d1.mu.Lock()
	d1.bodies = nil
	d1.mu.Unlock()
	d2.mu.Lock()
	d2.bodies = nil
	d2.mu.Unlock()
	resp, err := http.Post(s.URL()+"/v1/chat/completions", "application/json", strings.NewReader(strings.Replace(toolChatBody, `"stream":true`, `"stream":false`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	var whole struct {
		Choices []struct {
			Message struct {
				ToolCalls []answerToolCall `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	err = json.NewDecoder(resp.Body).Decode(&whole)
	resp.Body.Close()
	if err != nil || len(whole.Choices) != 1 || len(whole.Choices[0].Message.ToolCalls) != 1 {
		t.Fatalf("not streamed: %v %+v", err, whole)
	}
	if tc := whole.Choices[0].Message.ToolCalls[0]; tc.ID != "call_a" || tc.Function.Name != "get_weather" || tc.Function.Arguments != `{"city": "Paris", "days": [1, 2]}` {
		t.Fatalf("not streamed: tool call %+v", tc)
	}
}

// TestReplayResumesReasoningAndLogprobs: a chat whose reasoning parser ran
// and which asked for logprobs resumes by replay: reasoning and content
// whole and once, a logprob for each token once, even where a replayed
// chunk holds tokens the client has and tokens it has not.
func TestReplayResumesReasoningAndLogprobs(t *testing.T) {
	lp := func(toks ...string) string {
		var es []string
		for _, tok := range toks {
			es = append(es, fmt.Sprintf(`{"token":%q,"logprob":-0.5,"bytes":[1],"top_logprobs":[]}`, tok))
		}
		return `{"content":[` + strings.Join(es, ",") + `]}`
	}
	chunk := func(delta, logprobs string, ids ...int) string {
		b, _ := json.Marshal(ids)
		return fmt.Sprintf(`{"choices":[{"index":0,"delta":%s,"logprobs":%s,"token_ids":%s,"finish_reason":null}]}`, delta, logprobs, b)
	}
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&scriptedEngine{id: "d1", legs: [][]string{{
		chunk(`{"reasoning":"let me "}`, lp("let", " me"), 1000, 1001),
		chunk(`{"reasoning":"think"}`, lp(" think"), 1002),
	}}}).start(t)
	d2 := (&scriptedEngine{id: "d2", legs: [][]string{{
		chunk(`{"reasoning":"let"}`, lp("let"), 1000),
		chunk(`{"reasoning":" me think"}`, lp(" me", " think"), 1001, 1002),
		chunk(`{"reasoning":"."}`, lp("."), 1003),
		chunk(`{"content":"Sunny"}`, lp("</think>", "Sunny"), 1004, 1005),
		finishChunk("stop"),
		"[DONE]",
	}}}).start(t)
	s := newTestRouter(t, p, d1.fake(), d2.fake())
	a := postChat(t, s.URL()+"/v1/chat/completions",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":20,"stream":true,"seed":1,"logprobs":true,"return_token_ids":true}`)
	if a.dones != 1 || len(a.errs) != 0 {
		t.Fatalf("%d [DONE], errors %v", a.dones, a.errs)
	}
	if a.reasoning != "let me think." || a.content != "Sunny" || a.finish != "stop" {
		t.Fatalf("reasoning %q content %q finish %q", a.reasoning, a.content, a.finish)
	}
	if got := strings.Join(a.logprobTokens, "|"); got != "let| me| think|.|</think>|Sunny" || fmt.Sprint(a.ids) != "[1000 1001 1002 1003 1004 1005]" {
		t.Fatalf("logprob tokens %q ids %v: want each token once", got, a.ids)
	}
}

// TestChatOnAReasoningEngine: a chat whose engine registered a reasoning
// parser resumes only by replay, even when no reasoning reached the client
// yet (the engine's chat layer may still split what comes): a greedy one
// is replayed through the chat endpoint, an unseeded sampled one ends with
// resume_refused (reasoning).
func TestChatOnAReasoningEngine(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	for _, tc := range []struct {
		name, temperature string
		noAssignSeed      bool
		replayed, seeded  bool
	}{
		{"greedy", "0", false, true, false},
		{"sampled", "0.7", false, true, true},
		{"sampled-assign-seed-off", "0.7", true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d1 := (&scriptedEngine{id: "d1", reasoning: "qwen3", legs: [][]string{{
				chatChunk(`{"content":"Sun"}`, 1000),
			}}}).start(t)
			d2 := (&scriptedEngine{id: "d2", reasoning: "qwen3", legs: [][]string{{
				chatChunk(`{"content":"Sun"}`, 1000),
				chatChunk(`{"content":"ny"}`, 1001),
				finishChunk("stop"),
				"[DONE]",
			}}}).start(t)
			s := newTestRouterWith(t, func(c *Config) { c.NoAssignSeed = tc.noAssignSeed }, p, d1.fake(), d2.fake())
			a := postChat(t, s.URL()+"/v1/chat/completions",
				`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":20,"stream":true,"temperature":`+tc.temperature+`}`)
			d1.mu.Lock()
			first := d1.bodies[0]
			d1.mu.Unlock()
			if _, has := first["seed"]; has != tc.seeded {
				t.Fatalf("the first decode leg's seed: %v, want one: %v", first["seed"], tc.seeded)
			}
			if n := counted(t, s, "connex_router_seeds_assigned_total"); n != map[bool]float64{true: 1}[tc.seeded] {
				t.Fatalf("connex_router_seeds_assigned_total = %v", n)
			}
			if tc.replayed {
				if len(a.errs) != 0 || a.content != "Sunny" || a.dones != 1 {
					t.Fatalf("content %q errors %v [DONE]s %d: want the replayed answer", a.content, a.errs, a.dones)
				}
				d2.mu.Lock()
				path, replayed := d2.paths[0], d2.bodies[0]
				d2.mu.Unlock()
				if path != "/v1/chat/completions" {
					t.Fatalf("the resumed leg went to %s, want the chat endpoint (a replay)", path)
				}
				if replayed["seed"] != first["seed"] {
					t.Fatalf("the replay's seed %v, the first leg's %v: want the same", replayed["seed"], first["seed"])
				}
				return
			}
			if len(a.errs) != 1 || !strings.Contains(a.errs[0], "(reasoning)") || !strings.Contains(a.errs[0], "qwen3") || a.content != "Sun" {
				t.Fatalf("content %q errors %v: want resume_refused naming the reasoning parser", a.content, a.errs)
			}
			if n := counted(t, s, "connex_router_resumes_refused_total"); n != 1 {
				t.Fatalf("connex_router_resumes_refused_total = %v, want 1", n)
			}
		})
	}
}

// TestReplayThatDivergesIsRefused: a replay whose engine draws other tokens
// than the client has ends the answer with resume_refused (diverged), and
// nothing of the other answer reaches the client.
func TestReplayThatDivergesIsRefused(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&scriptedEngine{id: "d1", legs: [][]string{{
		chatChunk(toolHeader("call_a"), 1000),
		chatChunk(toolArgs(`{"city": "Pa`), 1001),
	}}}).start(t)
	for _, tc := range []struct{ name, chunk string }{
		{"ids", chatChunk(toolHeader("call_b"), 1000) + "\n\ndata: " + chatChunk(toolArgs(`{"city": "Pa`), 1009)},
		{"arguments", chatChunk(toolHeader("call_b"), 1000) + "\n\ndata: " + chatChunk(toolArgs(`{"city": "Lo`), 1001)},
		{"name", chatChunk(strings.Replace(toolHeader("call_b"), "get_weather", "get_time", 1), 1000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d2 := (&scriptedEngine{id: "d2", legs: [][]string{{tc.chunk, chatChunk(toolArgs(`ndon"}`), 1002), finishChunk("tool_calls"), "[DONE]"}}}).start(t)
			s := newTestRouter(t, p, d1.fake(), d2.fake())
			a := postChat(t, s.URL()+"/v1/chat/completions", toolChatBody)
			if a.dones != 1 || len(a.errs) != 1 || !strings.HasPrefix(a.errs[0], "resume_refused: ") || !strings.Contains(a.errs[0], "(diverged)") {
				t.Fatalf("%d [DONE], errors %v: want one resume_refused naming diverged", a.dones, a.errs)
			}
			if c := a.calls[0]; c == nil || c.args != `{"city": "Pa` || fmt.Sprint(a.ids) != "[1000 1001]" {
				t.Fatalf("the client got %+v, ids %v: want only what the first engine sent", c, a.ids)
			}
			if n := counted(t, s, "connex_router_resumes_refused_total"); n != 1 {
				t.Fatalf("connex_router_resumes_refused_total = %v, want 1", n)
			}
		})
	}
}

// TestReplayString: what a replayed string adds past what the client has,
// and a replay that differs from it.
func TestReplayString(t *testing.T) {
	at := 0
	for _, step := range []struct{ delta, want string }{{"ab", ""}, {"cde", "e"}, {"fg", "fg"}} {
		got, err := replayString(step.delta, "abcd", &at, "text")
		if err != nil || got != step.want {
			t.Fatalf("delta %q: %q %v, want %q", step.delta, got, err, step.want)
		}
	}
	at = 0
	if _, err := replayString("abX", "abcd", &at, "text"); err == nil {
		t.Fatal("a replay that differs from what the client has passed")
	}
}

// TestTrimLogprobs: a completion chunk's logprob lists lose their first
// entries with the ids the client has; lists that are not one entry per
// token cannot be cut.
func TestTrimLogprobs(t *testing.T) {
	raw := extraJSON(`{"text_offset":[0,3,6],"token_logprobs":[-1,-2,-3],"tokens":["a","b","c"],"top_logprobs":[{"a":-1},{"b":-2},{"c":-3}]}`)
	got, err := trimLogprobs(Completions, raw, 2, 3)
	if err != nil || got != `{"text_offset":[6],"token_logprobs":[-3],"tokens":["c"],"top_logprobs":[{"c":-3}]}` {
		t.Fatalf("%s %v", got, err)
	}
	if got, err := trimLogprobs(Completions, raw, 3, 3); err != nil || got != "" {
		t.Fatalf("all skipped: %q %v", got, err)
	}
	if _, err := trimLogprobs(Completions, raw, 1, 2); err == nil {
		t.Fatal("three entries for a chunk of two tokens were cut")
	}
}
