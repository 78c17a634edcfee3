package router

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestResumeRefusal(t *testing.T) {
	cases := []struct {
		kind Kind
		body string
		want string // reason, "" when the request resumes
	}{
		{Completions, `{"model":"m","prompt":"p"}`, ""},
		{Completions, `{"model":"m","prompt":"p","temperature":0,"seed":7}`, ""},
		{Completions, `{"model":"m","prompt":"p","temperature":0.7}`, ""}, // unseeded: the same distribution
		{Completions, `{"model":"m","prompt":"p","structured_outputs":{"regex":"[a-z]+"}}`, ""},
		{Completions, `{"model":"m","prompt":"p","response_format":{"type":"json_object"}}`, ""},
		{Completions, `{"model":"m","prompt":"p","repetition_penalty":1.3,"presence_penalty":0}`, ""},
		{Completions, `{"model":"m","prompt":"p","logprobs":null,"seed":null,"bad_words":[]}`, ""},
		{Completions, `{"model":"m","prompt":"p","logprobs":0}`, RefuseLogprobs},
		{Completions, `{"model":"m","prompt":"p","logprobs":5}`, RefuseLogprobs},
		{Completions, `{"model":"m","prompt":"p","seed":7}`, RefuseSeed}, // the default temperature samples
		{Completions, `{"model":"m","prompt":"p","seed":7,"temperature":1}`, RefuseSeed},
		{Completions, `{"model":"m","prompt":"p","presence_penalty":0.5}`, RefusePenalties},
		{Completions, `{"model":"m","prompt":"p","frequency_penalty":-1}`, RefusePenalties},
		{Completions, `{"model":"m","prompt":"p","bad_words":["no"]}`, RefuseBadWords},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}]}`, ""},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":false}`, ""},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"array"}}}}`, ""},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[],"tool_choice":"auto"}`, ""},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"}`, ""},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`, RefuseTools},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"}`, RefuseTools},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}}`, RefuseTools},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true}`, RefuseLogprobs},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2}`, RefuseLogprobs},
	}
	for _, tc := range cases {
		c, aerr := ParseClient(tc.kind, []byte(tc.body))
		if aerr != nil {
			t.Fatalf("%s: %v", tc.body, aerr.Message)
		}
		reason, why := resumeRefusal(c, false, "")
		if reason != tc.want || (reason != "") != (why != "") {
			t.Errorf("%s: refusal %q (%q), want %q", tc.body, reason, why, tc.want)
		}
	}
}

// TestResumeRefusalOfReasoning: an answer the engine's reasoning parser
// split is refused whatever the request says; tools still name themselves.
func TestResumeRefusalOfReasoning(t *testing.T) {
	c, _ := ParseClient(Chat, []byte(`{"model":"m","messages":[{"role":"user","content":"x"}]}`))
	if reason, _ := resumeRefusal(c, true, ""); reason != RefuseReasoning {
		t.Fatalf("refusal %q, want %q", reason, RefuseReasoning)
	}
	c, _ = ParseClient(Chat, []byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`))
	if reason, _ := resumeRefusal(c, true, ""); reason != RefuseTools {
		t.Fatalf("refusal %q, want %q", reason, RefuseTools)
	}
	// An engine that runs a reasoning parser: every chat, reasoning seen or
	// not (a chat that has not reasoned yet may still); completions resume.
	chat, _ := ParseClient(Chat, []byte(`{"model":"m","messages":[{"role":"user","content":"x"}]}`))
	if reason, why := resumeRefusal(chat, false, "qwen3"); reason != RefuseReasoning || !strings.Contains(why, "qwen3") {
		t.Fatalf("a chat on a qwen3 engine: refusal %q (%s), want %q naming the parser", reason, why, RefuseReasoning)
	}
	comp, _ := ParseClient(Completions, []byte(`{"model":"m","prompt":"p","structured_outputs":{"regex":"a+"}}`))
	if reason, _ := resumeRefusal(comp, false, "qwen3"); reason != "" {
		t.Fatalf("a completion on a qwen3 engine: refusal %q, want none (the connector continues its grammar)", reason)
	}
}

// TestResumeBodyKeepsStructuredOutputs: a resumed leg carries the request's
// constraint (structured_outputs, response_format, the legacy guided_*
// keys) and says how many of its prompt's tokens were generated, so the
// engine continues the grammar instead of restarting it.
func TestResumeBodyKeepsStructuredOutputs(t *testing.T) {
	params := json.RawMessage(`{"transfer_id":"t1","remote_num_tokens":2}`)
	for _, tc := range []struct {
		kind Kind
		body string
		keep []string
	}{
		{Completions, `{"model":"m","prompt":"p","max_tokens":9,"structured_outputs":{"regex":"a+"}}`, []string{"structured_outputs"}},
		{Completions, `{"model":"m","prompt":"p","max_tokens":9,"response_format":{"type":"json_object"}}`, []string{"response_format"}},
		{Completions, `{"model":"m","prompt":"p","max_tokens":9,"guided_choice":["yes","no"]}`, []string{"guided_choice"}},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":9,"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"array"}}}}`, []string{"response_format"}},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":9,"structured_outputs":{"choice":["a","b"]}}`, []string{"structured_outputs"}},
	} {
		c, aerr := ParseClient(tc.kind, []byte(tc.body))
		if aerr != nil {
			t.Fatal(aerr.Message)
		}
		b, err := ResumeBody(c, []uint32{1, 2}, []uint32{30, 31, 32}, params, "cmpl-1")
		if err != nil {
			t.Fatal(err)
		}
		var leg map[string]json.RawMessage
		if err := json.Unmarshal(b, &leg); err != nil {
			t.Fatal(err)
		}
		for _, k := range tc.keep {
			if string(leg[k]) != string(c.Body[k]) {
				t.Errorf("%s: the resumed leg's %s is %s, want the client's %s", tc.body, k, leg[k], c.Body[k])
			}
		}
		var kv struct {
			Resume    bool `json:"connex_resume"`
			Generated int  `json:"connex_resume_generated"`
		}
		if err := json.Unmarshal(leg["kv_transfer_params"], &kv); err != nil || !kv.Resume || kv.Generated != 3 {
			t.Errorf("%s: kv_transfer_params %s: want connex_resume and connex_resume_generated 3", tc.body, leg["kv_transfer_params"])
		}
		if string(leg["prompt"]) != "[1,2,30,31,32]" || string(leg["max_tokens"]) != "6" {
			t.Errorf("%s: prompt %s max_tokens %s", tc.body, leg["prompt"], leg["max_tokens"])
		}
		for _, k := range []string{"messages", "tools", "truncate_prompt_tokens", "prompt_logprobs"} {
			if _, ok := leg[k]; ok {
				t.Errorf("%s: the resumed leg carries %s", tc.body, k)
			}
		}
	}
	// A chat that names no max_tokens runs to the end of the context: its
	// resumed completions leg says so (null), not the completions default
	// of 16 (an absent max_tokens).
	chat, _ := ParseClient(Chat, []byte(`{"model":"m","messages":[{"role":"user","content":"x"}]}`))
	if b, err := ResumeBody(chat, []uint32{1, 2}, []uint32{30}, params, "chatcmpl-1"); err != nil || !strings.Contains(string(b), `"max_tokens":null`) {
		t.Errorf("a resumed chat without max_tokens: %s %v, want max_tokens null", b, err)
	}
	// A resume before any token says nothing about generated tokens.
	c, _ := ParseClient(Completions, []byte(`{"model":"m","prompt":"p","max_tokens":9}`))
	b, err := ResumeBody(c, []uint32{1, 2}, nil, params, "cmpl-1")
	if err != nil || strings.Contains(string(b), "connex_resume_generated") {
		t.Fatalf("a resume after no token: %s %v", b, err)
	}
}

// TestRefusedResumeEndsTheAnswer: with router_assign_seed off, a request
// the router cannot resume exactly (here: output penalties, sampled without
// a seed, which neither a prefix resume nor a replay gives again) whose
// decode engine breaks mid-stream ends with one resume_refused error and
// [DONE] after the tokens it had; no other engine is asked, and the refusal
// is counted by reason. The same request seeded resumes by replay.
func TestRefusedResumeEndsTheAnswer(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&fakeEngine{t: t, id: "d1", role: "decode", failAfter: 4}).start()
	d2 := (&fakeEngine{t: t, id: "d2", role: "decode"}).start()
	s := newTestRouterWith(t, func(c *Config) { c.NoAssignSeed = true }, p, d1, d2)
	a := streamAnswer(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":10,"stream":true,"presence_penalty":0.5,"temperature":0.8}`)
	if a.dones != 1 || fmt.Sprint(a.errs) != "[resume_refused]" || strings.Join(a.texts, "") != strings.Join(want(4), "") {
		t.Fatalf("texts %q, %d [DONE], errors %v: want the 4 tokens, one resume_refused and [DONE]", a.texts, a.dones, a.errs)
	}
	if len(d2.bodies) != 0 {
		t.Fatalf("the other decode engine got %d legs, want none", len(d2.bodies))
	}
	if n := counted(t, s, "connex_router_resumes_refused_total"); n != 1 {
		t.Fatalf("connex_router_resumes_refused_total = %v, want 1", n)
	}
	if n := counted(t, s, "connex_router_resumes_total"); n != 0 {
		t.Fatalf("connex_router_resumes_total = %v, want 0", n)
	}
	// Seeded, it is generated again on d2 from its first token (a replay:
	// the client's prompt, not the generated ids), and the client gets
	// each token once.
	a = streamAnswer(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":10,"stream":true,"presence_penalty":0.5,"temperature":0.8,"seed":3}`)
	if a.dones != 1 || len(a.errs) != 0 || strings.Join(a.texts, "") != strings.Join(want(10), "") {
		t.Fatalf("seeded: texts %q, errors %v", a.texts, a.errs)
	}
	if len(d2.bodies) != 1 || d2.bodies[0]["prompt"] != "abc" || d2.bodies[0]["max_tokens"] != float64(10) || d2.bodies[0]["seed"] != float64(3) {
		t.Fatalf("the replayed leg: %v, want the client's request again", d2.bodies)
	}
	if kv, _ := d2.bodies[0]["kv_transfer_params"].(map[string]any); kv["connex_resume"] != true || kv["connex_resume_generated"] != nil {
		t.Fatalf("the replayed leg's kv_transfer_params %v: want connex_resume and no generated tokens", kv)
	}
	if n := counted(t, s, "connex_router_resume_replays_total"); n != 1 {
		t.Fatalf("connex_router_resume_replays_total = %v, want 1", n)
	}
}

// TestReasonedAnswerIsNotResumed: a chat whose engine streamed reasoning
// (its reasoning parser runs) and then broke ends with resume_refused
// naming reasoning; the other decode engine is not asked.
func TestReasonedAnswerIsNotResumed(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := &fakeEngine{t: t, id: "d1", role: "decode"}
	d1.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"think %d \"},\"token_ids\":[%d],\"finish_reason\":null}]}\n\n", i, 1000+i)
			w.(http.Flusher).Flush()
		}
		// the stream breaks: no [DONE]
	}))
	t.Cleanup(d1.srv.Close)
	d2 := (&fakeEngine{t: t, id: "d2", role: "decode"}).start()
	s := newTestRouter(t, p, d1, d2)
	resp, err := http.Post(s.URL()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":10,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"reasoning":"think 2 "`) || !strings.Contains(string(body), `"code":"resume_refused"`) ||
		!strings.Contains(string(body), "(reasoning)") || strings.Count(string(body), "data: [DONE]") != 1 {
		t.Fatalf("want the reasoning relayed, then one resume_refused naming reasoning and [DONE]; got\n%s", body)
	}
	if len(d2.bodies) != 0 {
		t.Fatalf("the other decode engine got %d legs, want none", len(d2.bodies))
	}
}

// TestNeedsSeed: the router seeds only a request that samples without a
// seed and resumes only by replay; a prefix-resumable, greedy or seeded
// request keeps its body as the client sent it.
func TestNeedsSeed(t *testing.T) {
	tools := `"tools":[{"type":"function","function":{"name":"f"}}]`
	for _, tc := range []struct {
		kind   Kind
		body   string
		parser string
		want   bool
	}{
		{Completions, `{"model":"m","prompt":"p","temperature":0.7}`, "", false},
		{Completions, `{"model":"m","prompt":"p","temperature":0.7}`, "qwen3", false}, // completions are not parsed
		{Completions, `{"model":"m","prompt":"p","temperature":0.7,"logprobs":2}`, "", true},
		{Completions, `{"model":"m","prompt":"p","presence_penalty":0.5}`, "", true}, // default temperature samples
		{Completions, `{"model":"m","prompt":"p","presence_penalty":0.5,"temperature":0}`, "", false},
		{Completions, `{"model":"m","prompt":"p","presence_penalty":0.5,"top_k":1}`, "", false},
		{Completions, `{"model":"m","prompt":"p","presence_penalty":0.5,"seed":0}`, "", false},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":0.7}`, "", false},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":0.7}`, "qwen3", true},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":0.7,` + tools + `}`, "", true},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":0.7,` + tools + `,"tool_choice":"none"}`, "", false},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":0.7,` + tools + `,"seed":9}`, "", false},
	} {
		c, err := ParseClient(tc.kind, []byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if got := needsSeed(c, tc.parser); got != tc.want {
			t.Errorf("needsSeed(%s, %q) = %v, want %v", tc.body, tc.parser, got, tc.want)
		}
	}
	c, _ := ParseClient(Chat, []byte(`{"model":"m","messages":[{"role":"user","content":"x"}],`+tools+`}`))
	if seed := assignSeed(c, 1<<60+5); seed != 5 || string(c.Body["seed"]) != "5" || !replayable(c) {
		t.Fatalf("assignSeed: %d, body seed %s, replayable %v: want 5 (53 bits), in the body, replayable", seed, c.Body["seed"], replayable(c))
	}
}
