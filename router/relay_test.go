package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
	"github.com/connex/connex/messages"
)

// fakeEngine is a unit-test stand-in for an engine's HTTP API: a prefill
// answers with params and prompt ids; a decode streams token i+1000 for
// position i of the sequence. failAfter > 0 makes a decode break its
// stream (or, with hang, stop sending) after that many tokens.
type fakeEngine struct {
	t         *testing.T
	id, role  string
	failAfter int
	hang      bool
	gap       time.Duration // the engine's time per token (a paced decode)
	// pauseAt > 0: the engine falls silent for pause before that token
	// (a CPU-starved process: slow, but it answers its health probe).
	pauseAt int
	pause   time.Duration
	// pauseHealth: during the pause /health does not answer either (the
	// whole process is starved or stopped), and answers once it ends.
	pauseHealth bool
	pausing     chan struct{} // closed when the pause ends (pauseHealth)
	// firstDelay is the time a decode leg takes before its first token (a
	// resume's pull and recompute).
	firstDelay time.Duration
	// tag prefixes each token's text (default "w": " w1000").
	tag string
	// leftMidStart: a leg's client left during firstDelay.
	leftMidStart bool
	// serving counts the legs the engine is serving now.
	serving int
	status  int // non-zero: answer every leg with this status
	// streamError: answer every leg 200, then an error event and [DONE]
	// (vLLM's stream when the request fails inside the engine, e.g. its
	// KV load failed): "nested" ({"error":{…}}, vLLM now) or "flat"
	// ({"object":"error",…}, engines before).
	streamError string
	// finish is the last token's finish_reason (default "length").
	finish string
	code   string
	msg    string // the error's message (default "no")
	// served, if set, is closed when the engine gets its first leg.
	served chan struct{}
	// noDone: the stream breaks after its last token (the finish), before
	// [DONE].
	noDone bool
	// reasoning is the reasoning parser the engine registers ("": none).
	reasoning string
	// withhold: tokens whose text the engine holds back until the next
	// token (as vLLM does for a token that ends inside a UTF-8 character):
	// their chunk carries the id and no text.
	withhold map[int]bool

	mu     sync.Mutex
	bodies []map[string]any
	srv    *httptest.Server
}

func (f *fakeEngine) start() *fakeEngine {
	if f.pauseHealth {
		f.pausing = make(chan struct{})
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	f.t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEngine) engine() Engine {
	return Engine{Member: "m-" + f.id, Info: &messages.EngineInfo{EngineId: f.id, Role: f.role, Model: "m", BaseUrl: f.srv.URL, ReasoningParser: f.reasoning}}
}

func (f *fakeEngine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		if f.hang {
			<-r.Context().Done() // a hung process answers nothing
			return
		}
		if f.pausing != nil {
			select {
			case <-f.pausing:
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(http.StatusOK)
		return
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		f.t.Errorf("%s: body: %v", f.id, err)
		return
	}
	f.mu.Lock()
	f.serving++
	defer func() {
		f.mu.Lock()
		f.serving--
		f.mu.Unlock()
	}()
	f.bodies = append(f.bodies, body)
	if f.served != nil && len(f.bodies) == 1 {
		close(f.served)
	}
	f.mu.Unlock()
	if f.status != 0 {
		w.WriteHeader(f.status)
		msg := f.msg
		if msg == "" {
			msg = "no"
		}
		fmt.Fprintf(w, `{"error":{"message":%q,"type":"server_error","code":%q}}`, msg, f.code)
		return
	}
	prompt := []int{1, 2, 3}
	if f.role == "prefill" {
		fmt.Fprintf(w, `{"choices":[{"text":"x","prompt_token_ids":[1,2,3]}],"kv_transfer_params":{"transfer_id":"t1","remote_num_tokens":3,"do_remote_prefill":true}}`)
		return
	}
	if p, ok := body["prompt"].([]any); ok {
		prompt = prompt[:0]
		for _, v := range p {
			prompt = append(prompt, int(v.(float64)))
		}
	}
	max := int(body["max_tokens"].(float64))
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	switch f.streamError {
	case "nested":
		fmt.Fprint(w, "data: {\"error\":{\"message\":\"Internal server error\",\"type\":\"InternalServerError\",\"code\":500}}\n\n")
	case "flat":
		fmt.Fprint(w, "data: {\"object\":\"error\",\"message\":\"Internal server error\",\"type\":\"InternalServerError\",\"code\":500}\n\n")
	}
	if f.streamError != "" {
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	generated := len(prompt) - 3
	held := ""
	if f.firstDelay > 0 {
		select {
		case <-time.After(f.firstDelay):
		case <-r.Context().Done():
			// Left while starting: a real engine may not notice and keep
			// the request (and the hold it renews) alive.
			f.mu.Lock()
			f.leftMidStart = true
			f.mu.Unlock()
			return
		}
	}
	for i := 0; i < max; i++ {
		if f.failAfter > 0 && i == f.failAfter {
			if f.hang {
				<-r.Context().Done()
			}
			return // a broken stream: no [DONE]
		}
		if f.pauseAt > 0 && i == f.pauseAt {
			select {
			case <-time.After(f.pause):
			case <-r.Context().Done():
				return
			}
			if f.pausing != nil {
				close(f.pausing)
			}
		}
		tok := 1000 + generated + i
		fin := "null"
		if i == max-1 {
			fin = `"length"`
			if f.finish != "" {
				fin = strconv.Quote(f.finish)
			}
		}
		tag := f.tag
		if tag == "" {
			tag = "w"
		}
		text := held + fmt.Sprintf(" %s%d", tag, tok)
		held = ""
		if f.withhold[tok] && i < max-1 {
			text, held = "", text
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"text\":%q,\"token_ids\":[%d],\"finish_reason\":%s}]}\n\n", text, tok, fin)
		fl.Flush()
		if f.gap > 0 {
			select {
			case <-time.After(f.gap):
			case <-r.Context().Done():
				return
			}
		}
	}
	if f.noDone {
		return
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func newTestRouter(t *testing.T, engines ...*fakeEngine) *Server {
	t.Helper()
	return newTestRouterWith(t, nil, engines...)
}

// newTestRouterWith is newTestRouter with its Config changed by mod first.
func newTestRouterWith(t *testing.T, mod func(*Config), engines ...*fakeEngine) *Server {
	t.Helper()
	cfg := Config{
		Listen: "127.0.0.1:0",
		Engines: func() []Engine {
			var out []Engine
			for _, e := range engines {
				out = append(out, e.engine())
			}
			return out
		},
		Stall:          StallRule{Factor: 3, Floor: 50 * time.Millisecond, Cold: 200 * time.Millisecond, Ceiling: time.Second, FirstToken: 5 * time.Second},
		PrefillTimeout: 5 * time.Second, MaxResumes: 3, MaxBodyBytes: 1 << 20,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// stream posts body and returns the token texts of the SSE answer and
// whether it ended with [DONE].
func stream(t *testing.T, url, body string) (texts []string, done bool, errs []string) {
	t.Helper()
	a := streamAnswer(t, url, body)
	return a.texts, a.dones > 0, a.errs
}

// sseAnswer is what a streamed answer carried.
type sseAnswer struct {
	texts []string // one entry per choice chunk
	ids   []int    // token_ids (return_token_ids)
	dones int      // "data: [DONE]" lines
	errs  []string // error events' codes
}

// streamAnswer posts body and reads the whole SSE answer.
func streamAnswer(t *testing.T, url, body string) (a sseAnswer) {
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
				Text     string `json:"text"`
				TokenIDs []int  `json:"token_ids"`
			} `json:"choices"`
			Error map[string]any `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			t.Fatalf("chunk %q: %v", line, err)
		}
		if ch.Error != nil {
			a.errs = append(a.errs, fmt.Sprint(ch.Error["code"]))
		}
		for _, c := range ch.Choices {
			a.texts = append(a.texts, c.Text)
			a.ids = append(a.ids, c.TokenIDs...)
		}
	}
	return a
}

func want(n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, fmt.Sprintf(" w%d", 1000+i))
	}
	return out
}

func TestResumeAfterBrokenAndStalledStreams(t *testing.T) {
	for _, hang := range []bool{false, true} {
		t.Run(fmt.Sprintf("hang=%v", hang), func(t *testing.T) {
			p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
			d1 := (&fakeEngine{t: t, id: "d1", role: "decode", failAfter: 4, hang: hang}).start()
			d2 := (&fakeEngine{t: t, id: "d2", role: "decode"}).start()
			s := newTestRouter(t, p, d1, d2)
			texts, done, errs := stream(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":10,"stream":true}`)
			if !done || len(errs) > 0 || strings.Join(texts, "") != strings.Join(want(10), "") {
				t.Fatalf("texts %q done %v errs %v; want %q once", texts, done, errs, want(10))
			}
			if len(p.bodies) != 1 {
				t.Fatalf("%d prefill legs, want 1", len(p.bodies))
			}
			pb := p.bodies[0]
			if pb["max_tokens"].(float64) != 1 || pb["stream"] != false || pb["kv_transfer_params"].(map[string]any)["do_remote_decode"] != true {
				t.Fatalf("prefill leg is not vLLM's: %v", pb)
			}
			if len(d2.bodies) != 1 {
				t.Fatalf("%d resume legs", len(d2.bodies))
			}
			rb := d2.bodies[0]
			kv := rb["kv_transfer_params"].(map[string]any)
			prompt := rb["prompt"].([]any)
			if rb["max_tokens"].(float64) != 6 || len(prompt) != 3+4 || kv["connex_resume"] != true || kv["transfer_id"] != "t1" ||
				kv["connex_request_id"] != d1.bodies[0]["kv_transfer_params"].(map[string]any)["connex_request_id"] {
				t.Fatalf("resume leg: %v", rb)
			}
		})
	}
}

// TestBrokenAfterTheFinishIsDone: a decode leg whose stream breaks after
// the answer's finish (before [DONE]) gave the client its whole answer:
// no resume (it would ask for no token, or go on past the answer's end),
// no error.
func TestBrokenAfterTheFinishIsDone(t *testing.T) {
	for _, finish := range []string{"length", "stop"} {
		t.Run(finish, func(t *testing.T) {
			p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
			d1 := (&fakeEngine{t: t, id: "d1", role: "decode", noDone: true, finish: finish}).start()
			d2 := (&fakeEngine{t: t, id: "d2", role: "decode"}).start()
			s := newTestRouter(t, p, d1, d2)
			texts, done, errs := stream(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":5,"stream":true}`)
			if !done || len(errs) > 0 || strings.Join(texts, "") != strings.Join(want(5), "") {
				t.Fatalf("texts %q done %v errs %v; want %q once", texts, done, errs, want(5))
			}
			if len(d1.bodies)+len(d2.bodies) != 1 {
				t.Fatalf("%d decode legs, want 1 (no resume after the finish)", len(d1.bodies)+len(d2.bodies))
			}
			// The broken leg is closed, not watched for a resume that never
			// comes: its engine no longer counts as busy (Pick's load).
			poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
				if b := s.busySnapshot(); len(b) > 0 {
					return fmt.Errorf("engines still counted busy after the answer: %v", b)
				}
				return nil
			})
		})
	}
}

// TestResumeStartsAtWholeText: the decode engine dies right after a token
// whose text it held back (a partial UTF-8 character in vLLM). The resume
// starts before that token — a token-id prompt ending mid-character makes
// vLLM 0.32 stream the prompt back — and the client gets every token's
// text and id exactly once.
func TestResumeStartsAtWholeText(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&fakeEngine{t: t, id: "d1", role: "decode", failAfter: 4, withhold: map[int]bool{1002: true, 1003: true}}).start()
	d2 := (&fakeEngine{t: t, id: "d2", role: "decode"}).start()
	s := newTestRouter(t, p, d1, d2)
	a := streamAnswer(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":10,"stream":true,"return_token_ids":true}`)
	if len(a.errs) > 0 {
		t.Fatalf("errors %v", a.errs)
	}
	ids := a.ids
	if got, want := strings.Join(a.texts, ""), strings.Join(want(10), ""); got != want || a.dones != 1 {
		t.Fatalf("text %q (%d [DONE]), want %q once", got, a.dones, want)
	}
	for i, id := range ids {
		if id != 1000+i || len(ids) != 10 {
			t.Fatalf("token ids %v: want 1000..1009 once each", ids)
		}
	}
	if len(d2.bodies) != 1 {
		t.Fatalf("%d resume legs, want 1", len(d2.bodies))
	}
	// d1 relayed the ids of 1000..1003 but the text of 1000 and 1001 only:
	// the resume sends those two and asks for the 8 tokens after them.
	rb := d2.bodies[0]
	if prompt := rb["prompt"].([]any); len(prompt) != 3+2 || rb["max_tokens"].(float64) != 8 {
		t.Fatalf("resume leg: prompt %v, max_tokens %v; want the prompt and 2 generated ids, 8 more", prompt, rb["max_tokens"])
	}
}

func TestKVLoadFailureIsTheClients(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&fakeEngine{t: t, id: "d1", role: "decode", status: 503, code: CodeKVLoadFailed}).start()
	d2 := (&fakeEngine{t: t, id: "d2", role: "decode"}).start()
	s := newTestRouter(t, p, d1, d2)
	resp, err := http.Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"abc","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(data), CodeKVLoadFailed) || len(d2.bodies) != 0 {
		t.Fatalf("status %d body %s, resumes %d: a failed KV load under policy fail must reach the client, not another engine", resp.StatusCode, data, len(d2.bodies))
	}
}

func TestClientErrors(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d := (&fakeEngine{t: t, id: "d", role: "decode"}).start()
	s := newTestRouter(t, p, d)
	cases := []struct {
		path, body, code string
		status           int
	}{
		{"/v1/completions", `{"model":"nope","prompt":"a"}`, CodeModelNotFound, 404},
		{"/v1/completions", `{"model":"m","prompt":"a"`, CodeInvalidRequest, 400},
		{"/v1/completions", `{"model":"m"}`, CodeInvalidRequest, 400},
		{"/v1/completions", `{"model":"m","prompt":"a","max_tokens":0}`, CodeInvalidRequest, 400},
		{"/v1/completions", `{"model":"m","prompt":"a","n":2}`, CodeInvalidRequest, 400},
		{"/v1/chat/completions", `{"model":"m","messages":[]}`, CodeInvalidRequest, 400},
		{"/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("a", 2<<20) + `"}`, CodeBodyTooLarge, 413},
		{"/v1/nothing", `{}`, CodeNotFound, 404},
	}
	for _, c := range cases {
		resp, err := http.Post(s.URL()+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error APIError `json:"error"`
		}
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if err != nil || resp.StatusCode != c.status || e.Error.Code != c.code || e.Error.Message == "" {
			t.Errorf("%s %.60s: status %d %+v (%v), want %d %s", c.path, c.body, resp.StatusCode, e.Error, err, c.status, c.code)
		}
	}
	if len(p.bodies)+len(d.bodies) != 0 {
		t.Fatalf("bad requests reached engines: %d", len(p.bodies)+len(d.bodies))
	}
}

func TestNonStreamedSurvivesABrokenStream(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&fakeEngine{t: t, id: "d1", role: "decode", failAfter: 3}).start()
	d2 := (&fakeEngine{t: t, id: "d2", role: "decode"}).start()
	s := newTestRouter(t, p, d1, d2)
	resp, err := http.Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"abc","max_tokens":8}`))
	if err != nil {
		t.Fatal(err)
	}
	var ans struct {
		Object  string `json:"object"`
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage  map[string]int `json:"usage"`
		Connex map[string]any `json:"connex"`
	}
	err = json.NewDecoder(resp.Body).Decode(&ans)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || ans.Object != "text_completion" || len(ans.Choices) != 1 {
		t.Fatalf("status %d %+v %v", resp.StatusCode, ans, err)
	}
	if ans.Choices[0].Text != strings.Join(want(8), "") || ans.Choices[0].FinishReason != "length" {
		t.Fatalf("text %q finish %q", ans.Choices[0].Text, ans.Choices[0].FinishReason)
	}
	if ans.Usage["completion_tokens"] != 8 || ans.Usage["prompt_tokens"] != 3 || ans.Connex["resumes"].(float64) != 1 {
		t.Fatalf("usage %v connex %v", ans.Usage, ans.Connex)
	}
	if resp.Header.Get("X-Connex-Decode-Engine") != "d2" || resp.Header.Get("X-Connex-Prefill-Engine") != "p" {
		t.Fatalf("headers %v", resp.Header)
	}
	// The decode legs are always streamed, whatever the client asked.
	if d1.bodies[0]["stream"] != true {
		t.Fatalf("decode leg not streamed: %v", d1.bodies[0])
	}
}

func TestChatStreamShape(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d := (&fakeEngine{t: t, id: "d", role: "decode"}).start()
	s := newTestRouter(t, p, d)
	resp, err := http.Post(s.URL()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	lines := strings.Split(strings.TrimSpace(string(data)), "\n\n")
	// role chunk, 3 content chunks, usage chunk, [DONE]
	if len(lines) != 6 || lines[5] != "data: [DONE]" || !strings.Contains(lines[0], `"role":"assistant"`) ||
		!strings.Contains(lines[1], `"object":"chat.completion.chunk"`) || !strings.Contains(lines[1], `"delta":{"content":" w1000"}`) ||
		!strings.Contains(lines[4], `"usage":{"prompt_tokens":3,"completion_tokens":3,"total_tokens":6}`) {
		t.Fatalf("chat stream:\n%s", data)
	}
}

// TestResumeWhenTheEngineLeavesMembership: a decode engine that still
// streams (slowly) but is no longer advertised — its connexd died or froze
// — is given up on, and the request resumes on an engine that is.
func TestResumeWhenTheEngineLeavesMembership(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&fakeEngine{t: t, id: "d1", role: "decode", failAfter: 4, hang: true, served: make(chan struct{})}).start()
	d2 := (&fakeEngine{t: t, id: "d2", role: "decode"}).start()
	var mu sync.Mutex
	advertised := []*fakeEngine{p, d1, d2}
	s, err := New(Config{
		Listen: "127.0.0.1:0",
		Engines: func() []Engine {
			mu.Lock()
			defer mu.Unlock()
			var out []Engine
			for _, e := range advertised {
				out = append(out, e.engine())
			}
			return out
		},
		// A stall window far beyond the test: only membership can end d1's leg.
		Stall:          StallRule{Factor: 8, Floor: time.Hour, Cold: time.Hour, Ceiling: time.Hour, FirstToken: time.Hour},
		PrefillTimeout: 5 * time.Second, MaxResumes: 3, MaxBodyBytes: 1 << 20,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	go func() {
		// Once d1 has been given the decode leg, it leaves the cluster.
		<-d1.served
		mu.Lock()
		advertised = []*fakeEngine{p, d2}
		mu.Unlock()
	}()
	texts, done, errs := stream(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":10,"stream":true}`)
	if !done || len(errs) > 0 || strings.Join(texts, "") != strings.Join(want(10), "") {
		t.Fatalf("texts %q done %v errs %v", texts, done, errs)
	}
	if len(d2.bodies) != 1 {
		t.Fatalf("%d legs on d2, want the resume", len(d2.bodies))
	}
}

// TestStarvedEngineIsNotMoved: a decode engine that falls silent past the
// stall window but answers its health probe (CPU-starved, not hung) keeps
// its request: no resume, the whole answer from it. A hung one (no answer
// to the probe either) is moved: TestResumeAfterBrokenAndStalledStreams.
func TestStarvedEngineIsNotMoved(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&fakeEngine{t: t, id: "d1", role: "decode", pauseAt: 4, pause: 400 * time.Millisecond}).start()
	d2 := (&fakeEngine{t: t, id: "d2", role: "decode"}).start()
	s := newTestRouter(t, p, d1, d2) // stall window 200 ms: silent for twice that
	texts, done, errs := stream(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":10,"stream":true}`)
	if !done || len(errs) > 0 || strings.Join(texts, "") != strings.Join(want(10), "") {
		t.Fatalf("texts %q done %v errs %v; want %q once", texts, done, errs, want(10))
	}
	d2.mu.Lock()
	defer d2.mu.Unlock()
	if len(d2.bodies) != 0 {
		t.Fatalf("the starved engine's request was moved: %d leg(s) on d2", len(d2.bodies))
	}
}

// TestFalseResumeIsCounted: an engine silent past its deadline whose health
// probe does not answer in time either (a process starved for 300 ms) is
// given up; when it shows life (its next token, its probe's answer) before
// the resumed stream's first token — the resume takes 500 ms here — the
// resume is counted false. Not when the resume delivers first, nor for a
// hung engine or a broken stream.
func TestFalseResumeIsCounted(t *testing.T) {
	starved := func() *fakeEngine {
		return &fakeEngine{id: "d1", role: "decode", pauseAt: 4, pause: 300 * time.Millisecond, pauseHealth: true}
	}
	for _, c := range []struct {
		name   string
		d1     *fakeEngine
		resume time.Duration // d2's time to its first token
		false  float64
	}{
		{"starved", starved(), 500 * time.Millisecond, 1},
		{"starved, the resume first", starved(), 0, 0},
		{"hung", &fakeEngine{id: "d1", role: "decode", failAfter: 4, hang: true}, 500 * time.Millisecond, 0},
		{"broken", &fakeEngine{id: "d1", role: "decode", failAfter: 4}, 500 * time.Millisecond, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
			c.d1.t = t
			d1 := c.d1.start()
			d2 := (&fakeEngine{t: t, id: "d2", role: "decode", firstDelay: c.resume}).start()
			s := newTestRouter(t, p, d1, d2) // stall window 200 ms: d1 given up 200 ms after its 4th token
			texts, done, errs := stream(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":10,"stream":true}`)
			if !done || len(errs) > 0 || strings.Join(texts, "") != strings.Join(want(10), "") {
				t.Fatalf("texts %q done %v errs %v; want %q once", texts, done, errs, want(10))
			}
			if n := counted(t, s, "connex_router_resumes_total"); n != 1 {
				t.Fatalf("%v resumes, want 1", n)
			}
			poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
				if s.busySnapshot()["d1"] != 0 {
					return fmt.Errorf("the given-up leg on d1 is still open")
				}
				return nil
			})
			if n := counted(t, s, "connex_router_false_resumes_total"); n != c.false {
				t.Fatalf("%v false resumes, want %v", n, c.false)
			}
		})
	}
}

// counted is the sum of the router's counter name over its labels.
func counted(t *testing.T, s *Server, name string) float64 {
	t.Helper()
	mfs, err := s.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// TestStalledLegWithNowhereToGoIsKept: the only decode engine falls silent
// past its stall window and does not answer its probe in time (starved
// for 400 ms): with no engine to resume on, the router keeps waiting on it
// rather than answering an error, and the whole answer comes from it.
func TestStalledLegWithNowhereToGoIsKept(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&fakeEngine{t: t, id: "d1", role: "decode", pauseAt: 4, pause: 400 * time.Millisecond, pauseHealth: true}).start()
	s := newTestRouter(t, p, d1) // stall window 200 ms
	texts, done, errs := stream(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":10,"stream":true}`)
	if !done || len(errs) > 0 || strings.Join(texts, "") != strings.Join(want(10), "") {
		t.Fatalf("texts %q done %v errs %v; want %q once", texts, done, errs, want(10))
	}
	if n := counted(t, s, "connex_router_resumes_total"); n != 0 {
		t.Fatalf("%v resumes with nowhere to go", n)
	}
}
