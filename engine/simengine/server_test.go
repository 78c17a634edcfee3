package simengine

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/engine/shim"
	"github.com/connex/connex/harness/poll"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
)

// fakeKV plays the shim in-process: holds live in a shared table, pulls
// copy from the holder's region (or are broken on purpose).
type fakeKV struct {
	id     string
	region *kvmem.Region
	holds  *holdTable
	policy string
	// corrupt makes a successful pull leave the destination blocks zeroed.
	corrupt bool
	// holdGate, if set, runs inside Hold before the hold is made (a slow
	// hold.create), with Hold's context.
	holdGate func(ctx context.Context)

	mu     sync.Mutex
	alloc  *shim.Allocator
	acts   []*fakeAct
	inFlow int
}

type holdTable struct {
	mu sync.Mutex
	m  map[string]fakeHold
	n  int
}

type fakeHold struct {
	kv     *fakeKV
	blocks []uint32
}

func newFakeKV(t *testing.T, id string, holds *holdTable) *fakeKV {
	r := testRegion(t, "small", 32)
	return &fakeKV{id: id, region: r, holds: holds, policy: shim.PolicyFail, alloc: shim.NewAllocator(32)}
}

func (f *fakeKV) Ranks() []*kvmem.Region { return []*kvmem.Region{f.region} }
func (f *fakeKV) Alloc(_ context.Context, n int) ([]uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.alloc.Alloc(n)
}
func (f *fakeKV) Free(ids []uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.alloc.Free(ids); err != nil {
		panic(err)
	}
}
func (f *fakeKV) Hold(ctx context.Context, blocks []uint32, n uint32) (*messages.KVTransferParams, error) {
	if f.holdGate != nil {
		f.holdGate(ctx)
	}
	f.holds.mu.Lock()
	f.holds.n++
	id := fmt.Sprintf("%032x", f.holds.n)
	f.holds.m[id] = fakeHold{kv: f, blocks: blocks}
	f.holds.mu.Unlock()
	f.mu.Lock()
	_, _ = f.alloc.Hold(id, blocks)
	f.mu.Unlock()
	return &messages.KVTransferParams{TransferId: id, RemoteCtrl: &messages.RemoteCtrl{Member: "m-" + f.id}, RemoteEngineId: f.id,
		RemoteBlockIds: blocks, RemoteNumTokens: n, TpSize: 1, BlockSize: 16, RetainS: 60}, nil
}

// Release is the owner's hold.release: the hold ends and its blocks come
// back as with blocks.freed.
func (f *fakeKV) Release(_ context.Context, id string) error {
	f.holds.mu.Lock()
	_, ok := f.holds.m[id]
	f.holds.mu.Unlock()
	if !ok {
		return fmt.Errorf("unknown transfer %s", id)
	}
	f.holds.release(id)
	return nil
}

// release drops a hold as its blocks.freed notice would.
func (h *holdTable) release(id string) {
	h.mu.Lock()
	fh := h.m[id]
	delete(h.m, id)
	h.mu.Unlock()
	fh.kv.mu.Lock()
	_, _ = fh.kv.alloc.Freed(id, fh.blocks)
	fh.kv.mu.Unlock()
}

func (f *fakeKV) Pull(_ context.Context, p *messages.KVTransferParams, dst []uint32) (*messages.PullDone, error) {
	f.holds.mu.Lock()
	h, ok := f.holds.m[p.TransferId]
	f.holds.mu.Unlock()
	if !ok {
		return nil, &shim.LoadError{TransferID: p.TransferId, Code: api.CodeReleased, Reason: "released", Policy: f.policy, Detail: "hold released"}
	}
	copyBlocks(h.kv.region, h.blocks, f.region, dst)
	if f.corrupt { // as if the bytes never arrived
		for l := uint32(0); l < f.region.Layout.Layers; l++ {
			for k := uint32(0); k < 2; k++ {
				clear(f.region.Block(l, k, dst[len(dst)-1]))
			}
		}
	}
	return &messages.PullDone{Ok: true, KvLoadFailurePolicy: f.policy}, nil
}

func (f *fakeKV) StartRequest(_ context.Context, s shim.RequestSpec) (Activation, error) {
	a := &fakeAct{spec: s}
	a.ctx, a.cancel = context.WithCancelCause(context.Background())
	f.mu.Lock()
	f.acts = append(f.acts, a)
	f.mu.Unlock()
	return a, nil
}
func (f *fakeKV) Begin() func() {
	f.mu.Lock()
	f.inFlow++
	f.mu.Unlock()
	return func() { f.mu.Lock(); f.inFlow--; f.mu.Unlock() }
}
func (f *fakeKV) Counts() (uint32, uint32, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.alloc.FreeCount(), f.alloc.Total(), f.alloc.Held()
}
func (f *fakeKV) Policy() string { return f.policy }

func (f *fakeKV) allFree() bool {
	free, total, _ := f.Counts()
	return free == total
}

type fakeAct struct {
	spec     shim.RequestSpec
	ctx      context.Context
	cancel   context.CancelCauseFunc
	mu       sync.Mutex
	reported []uint32
	finished bool
	left     bool
}

func (a *fakeAct) Report(t ...uint32) {
	a.mu.Lock()
	a.reported = append(a.reported, t...)
	a.mu.Unlock()
}
func (a *fakeAct) Context() context.Context { return a.ctx }
func (a *fakeAct) Finish(context.Context) error {
	a.mu.Lock()
	a.finished = true
	a.mu.Unlock()
	return nil
}
func (a *fakeAct) Abandon() { a.mu.Lock(); a.left = true; a.mu.Unlock() }

func newTestServer(t *testing.T, kv KV, decode time.Duration) *httptest.Server {
	s := NewServer(Config{KV: kv, EngineID: "e1", Role: "decode", Model: "connex-sim", MaxModelLen: 400, DecodePerToken: decode})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return ts
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// prefillLeg runs the prefill leg of prompt (a JSON string) on the prefill
// server at url and returns the kv_transfer_params it answers with.
func prefillLeg(t *testing.T, url, prompt string) string {
	t.Helper()
	status, body := post(t, url+"/v1/completions", `{"prompt":`+prompt+`,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`)
	var r struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if status != 200 || json.Unmarshal([]byte(body), &r) != nil || !strings.Contains(string(r.KV), `"do_remote_prefill":true`) {
		t.Fatalf("prefill leg: %d %s", status, body)
	}
	return string(r.KV)
}

func TestSimRequestValidation(t *testing.T) {
	kv := newFakeKV(t, "e1", &holdTable{m: map[string]fakeHold{}})
	ts := newTestServer(t, kv, 0)
	long := strings.Repeat("x", 390)
	cases := []struct {
		path, body string
		status     int
		code       string
	}{
		{"/v1/completions", `{"model":"connex-sim","prompt":`, 400, "invalid_json"},
		{"/v1/completions", `{"model":"connex-sim","prompt":"hi","max_tokens":"many"}`, 400, "invalid_type"},
		{"/v1/completions", `{"model":"connex-sim","prompt":{"a":1}}`, 400, "invalid_type"},
		{"/v1/completions", `{"model":"gpt-9","prompt":"hi"}`, 404, "model_not_found"},
		{"/v1/completions", `{"model":"connex-sim","prompt":"hi","n":2}`, 400, "invalid_value"},
		{"/v1/completions", `{"model":"connex-sim","prompt":"hi","max_tokens":0}`, 400, "invalid_value"},
		{"/v1/completions", `{"model":"connex-sim","prompt":""}`, 400, "invalid_value"},
		{"/v1/completions", `{"model":"connex-sim","prompt":[1,2,99999]}`, 400, "invalid_value"},
		{"/v1/completions", `{"model":"connex-sim","prompt":"` + long + `","max_tokens":20}`, 400, "context_length_exceeded"},
		{"/v1/completions", `{"model":"connex-sim","prompt":"hi","kv_transfer_params":{"do_remote_prefill":true}}`, 400, "invalid_value"},
		{"/v1/completions", `{"model":"connex-sim","prompt":"hi","kv_transfer_params":{"do_remote_prefill":"yes"}}`, 400, "invalid_value"},
		{"/v1/chat/completions", `{"model":"connex-sim","messages":"hi"}`, 400, "invalid_type"},
		{"/v1/chat/completions", `{"model":"connex-sim","messages":[]}`, 400, "invalid_value"},
		{"/v1/chat/completions", `{"model":"connex-sim","messages":[{"role":"user","content":"x"}],"max_completion_tokens":-1}`, 400, "invalid_value"},
		{"/v1/nothing", `{}`, 404, "not_found"},
	}
	for _, c := range cases {
		status, body := post(t, ts.URL+c.path, c.body)
		var e struct {
			Error struct {
				Message, Type, Code string
				Param               *string
			}
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || status != c.status || e.Error.Code != c.code || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("%s %s: %d %s, want %d with code %s", c.path, c.body, status, body, c.status, c.code)
		}
	}
	// A region smaller than --max-model-len: the engine advertises and
	// enforces what its region holds (32 blocks of 16 tokens), and a prompt
	// beyond it is the prompt's fault, whatever max_tokens says.
	big := NewServer(Config{KV: kv, EngineID: "e1", Model: "connex-sim", MaxModelLen: 4096})
	ts2 := httptest.NewServer(big.Handler())
	defer ts2.Close()
	if status, body := post(t, ts2.URL+"/v1/completions", `{"prompt":"`+strings.Repeat("y", 600)+`","max_tokens":5}`); status != 400 ||
		!strings.Contains(body, `"param":"prompt"`) || !strings.Contains(body, "maximum context length is 512 tokens") || !strings.Contains(body, "600 tokens") {
		t.Errorf("prompt larger than the region: %d %s", status, body)
	}
	if r, err := http.Get(ts2.URL + "/v1/models"); err != nil {
		t.Error(err)
	} else {
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if !strings.Contains(string(b), `"max_model_len":512`) {
			t.Errorf("/v1/models of an engine whose region holds 512 tokens: %s", b)
		}
	}
	// "max_tokens": null runs to the end of the context, as vLLM does (a
	// chat's default, and what a resumed chat leg asks); none gives 16.
	for _, c := range []struct {
		body string
		want func(prompt int) int
	}{
		{`{"prompt":"to the end","max_tokens":null}`, func(prompt int) int { return 512 - prompt }},
		{`{"prompt":"to the end"}`, func(int) int { return DefaultMaxTokens }},
	} {
		status, body := post(t, ts2.URL+"/v1/completions", c.body)
		var r struct {
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if status != 200 || json.Unmarshal([]byte(body), &r) != nil || r.Usage.PromptTokens == 0 {
			t.Fatalf("%s: %d %s", c.body, status, body)
		}
		if want := c.want(r.Usage.PromptTokens); r.Usage.CompletionTokens != want {
			t.Errorf("%s: %d completion tokens, want %d", c.body, r.Usage.CompletionTokens, want)
		}
	}
	resp, err := http.Get(ts.URL + "/v1/completions")
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/completions: %v %v", resp.StatusCode, err)
	}
	if !kv.allFree() || len(kv.acts) != 0 {
		t.Fatalf("bad requests leaked: all free=%v, activations %d", kv.allFree(), len(kv.acts))
	}
}

type sseEvent struct {
	raw  string
	data map[string]any
}

func readSSE(t *testing.T, r io.Reader) (events []sseEvent, done bool) {
	t.Helper()
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return events, false
		}
		blank, _ := br.ReadString('\n')
		if !strings.HasPrefix(line, "data: ") || blank != "\n" {
			t.Fatalf("not an SSE event: %q then %q", line, blank)
		}
		payload := strings.TrimSuffix(strings.TrimPrefix(line, "data: "), "\n")
		if payload == "[DONE]" {
			if rest, _ := io.ReadAll(br); len(rest) != 0 {
				t.Fatalf("bytes after [DONE]: %q", rest)
			}
			return events, true
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(payload), &m); err != nil {
			t.Fatalf("event %q: %v", payload, err)
		}
		events = append(events, sseEvent{raw: payload, data: m})
	}
}

func TestSimSSEFormatAndStreamEqualsNonStream(t *testing.T) {
	kv := newFakeKV(t, "e1", &holdTable{m: map[string]fakeHold{}})
	ts := newTestServer(t, kv, 0)
	for _, chat := range []bool{false, true} {
		path, in := "/v1/completions", `"prompt":"stream me"`
		if chat {
			path, in = "/v1/chat/completions", `"messages":[{"role":"user","content":"stream me"}]`
		}
		_, body := post(t, ts.URL+path, `{"model":"connex-sim",`+in+`,"max_tokens":5,"return_token_ids":true}`)
		var whole map[string]any
		if err := json.Unmarshal([]byte(body), &whole); err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post(ts.URL+path, "application/json", strings.NewReader(`{"model":"connex-sim",`+in+`,"max_tokens":5,"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true}`))
		if err != nil {
			t.Fatal(err)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("stream content type %q", ct)
		}
		events, done := readSSE(t, resp.Body)
		resp.Body.Close()
		if !done {
			t.Fatal("stream did not end with data: [DONE]")
		}
		last := events[len(events)-1].data
		if ch := last["choices"].([]any); len(ch) != 0 || last["usage"] == nil {
			t.Fatalf("usage chunk %v", last)
		}
		first := events[0].data
		if first["connex"] == nil {
			t.Fatalf("first chunk has no connex object: %s", events[0].raw)
		}
		var text string
		var ids []any
		for _, e := range events[:len(events)-1] {
			c := e.data["choices"].([]any)[0].(map[string]any)
			if chat {
				text += fmt.Sprint(c["delta"].(map[string]any)["content"])
			} else {
				text += c["text"].(string)
			}
			if tid, ok := c["token_ids"].([]any); ok {
				ids = append(ids, tid...)
			}
		}
		wc := whole["choices"].([]any)[0].(map[string]any)
		wantText := fmt.Sprint(wc["text"])
		prompt := first["choices"].([]any)[0].(map[string]any)["prompt_token_ids"]
		if chat {
			wantText = fmt.Sprint(wc["message"].(map[string]any)["content"])
			prompt = first["prompt_token_ids"]
			if whole["prompt_token_ids"] == nil || events[0].data["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)["role"] != "assistant" {
				t.Fatalf("chat: prompt_token_ids top level and a role chunk expected: %s / %s", body, events[0].raw)
			}
		}
		if text != wantText || len(ids) != 5 || fmt.Sprint(ids) != fmt.Sprint(wc["token_ids"]) || prompt == nil {
			t.Fatalf("chat=%v: streamed %q %v (prompt ids %v), non-streamed %q %v", chat, text, ids, prompt, wantText, wc["token_ids"])
		}
	}
	if !kv.allFree() {
		t.Fatal("blocks not freed after local requests")
	}
}

func TestSimPrefillDecodeInProcess(t *testing.T) {
	holds := &holdTable{m: map[string]fakeHold{}}
	p, d := newFakeKV(t, "p", holds), newFakeKV(t, "d", holds)
	pts, dts := newTestServer(t, p, 0), newTestServer(t, d, 0)
	const text = `"disaggregated prefill and decode, in one process"`
	const prompt = `"prompt":` + text
	_, ref := post(t, dts.URL+"/v1/completions", `{`+prompt+`,"max_tokens":8,"return_token_ids":true}`)
	legs := func() string { return prefillLeg(t, pts.URL, text) }
	tokens := func(body string) string {
		var r struct {
			Choices []struct {
				TokenIDs []uint32 `json:"token_ids"`
			} `json:"choices"`
		}
		_ = json.Unmarshal([]byte(body), &r)
		if len(r.Choices) == 0 {
			return body
		}
		return fmt.Sprint(r.Choices[0].TokenIDs)
	}
	params := legs()
	status, body := post(t, dts.URL+"/v1/completions", `{`+prompt+`,"max_tokens":8,"return_token_ids":true,"kv_transfer_params":`+params+`}`)
	if status != 200 || tokens(body) != tokens(ref) || !strings.Contains(body, `"kv_load":"pulled"`) {
		t.Fatalf("decode leg %d %s\nwant tokens of %s", status, body, ref)
	}
	a := d.acts[0]
	if !a.finished || len(a.reported) != 8 || a.spec.Takeover {
		t.Fatalf("activation: finished=%v reported=%v", a.finished, a.reported)
	}
	for id := range holds.m {
		holds.release(id) // its blocks.freed
	}

	// Corrupt bytes (the pull "succeeded" but wrote nothing): policy fail.
	params = legs()
	d.corrupt = true
	status, body = post(t, dts.URL+"/v1/completions", `{`+prompt+`,"max_tokens":8,"stream":true,"kv_transfer_params":`+params+`}`)
	if status != 503 || !strings.Contains(body, `"kv_load_failed"`) || !strings.Contains(body, "corrupt") {
		t.Fatalf("corrupt load, policy fail: %d %s", status, body)
	}
	// Policy recompute: same answer, one prefill.
	d.policy = shim.PolicyRecompute
	status, body = post(t, dts.URL+"/v1/completions", `{`+prompt+`,"max_tokens":8,"return_token_ids":true,"kv_transfer_params":`+params+`}`)
	if status != 200 || tokens(body) != tokens(ref) || !strings.Contains(body, `"kv_load":"recomputed"`) || !strings.Contains(body, `"prefills":1`) {
		t.Fatalf("corrupt load, policy recompute: %d %s", status, body)
	}
	for id := range holds.m {
		holds.release(id)
	}
	if !p.allFree() || !d.allFree() {
		t.Fatal("blocks leaked")
	}
}

func TestSimClientDisconnectFinishesTheRequest(t *testing.T) {
	holds := &holdTable{m: map[string]fakeHold{}}
	p, d := newFakeKV(t, "p", holds), newFakeKV(t, "d", holds)
	pts, dts := newTestServer(t, p, 0), newTestServer(t, d, 20*time.Millisecond)
	kv := prefillLeg(t, pts.URL, `"go away midway"`)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", dts.URL+"/v1/completions", strings.NewReader(`{"prompt":"go away midway","max_tokens":200,"stream":true,"kv_transfer_params":`+kv+`}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for range 4 { // two events
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	resp.Body.Close()
	poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		d.mu.Lock()
		a := d.acts[0]
		d.mu.Unlock()
		a.mu.Lock()
		fin := a.finished
		a.mu.Unlock()
		if free := d.allFree(); !fin || !free {
			return fmt.Errorf("client gone: finished=%v, decode blocks all free=%v", fin, free)
		}
		return nil
	})
}

func TestSimFencedStreamIsCut(t *testing.T) {
	holds := &holdTable{m: map[string]fakeHold{}}
	p, d := newFakeKV(t, "p", holds), newFakeKV(t, "d", holds)
	pts, dts := newTestServer(t, p, 0), newTestServer(t, d, 10*time.Millisecond)
	kv := prefillLeg(t, pts.URL, `"fence me"`)
	resp, err := http.Post(dts.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"fence me","max_tokens":300,"stream":true,"kv_transfer_params":`+kv+`}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	a := d.acts[0]
	d.mu.Unlock()
	a.cancel(shim.ErrFenced)
	// A cut stream ends without [DONE] and long before the 300 tokens it
	// asked for; one that went on would carry them all and [DONE].
	rest, _ := io.ReadAll(br)
	if events := strings.Count(string(rest), "data:"); strings.Contains(string(rest), "[DONE]") || events >= 150 {
		t.Fatalf("fenced stream went on: %d events after the fence, [DONE]=%v", events, strings.Contains(string(rest), "[DONE]"))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.finished || !a.left {
		t.Fatalf("a fenced request must not finish (release someone else's hold): finished=%v abandoned=%v", a.finished, a.left)
	}
}

// TestUndeliveredPrefillReleasesItsHold: the client of a prefill leg leaves
// while hold.create runs (slow); the hold is made all the same (connexd
// created it), but its answer never reaches anyone, so the engine releases
// it at once and its blocks come back.
func TestUndeliveredPrefillReleasesItsHold(t *testing.T) {
	holds := &holdTable{m: map[string]fakeHold{}}
	kv := newFakeKV(t, "p", holds)
	inHold := make(chan struct{})
	kv.holdGate = func(ctx context.Context) {
		close(inHold)
		<-ctx.Done() // the client left while hold.create ran
	}
	srv := NewServer(Config{KV: kv, EngineID: "p", Model: "connex-sim", MaxModelLen: 4096})
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL+"/v1/completions",
			strings.NewReader(`{"prompt":"a prompt whose client leaves","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-inHold
	cancel()
	<-done
	poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		holds.mu.Lock()
		n := len(holds.m)
		holds.mu.Unlock()
		if n != 0 || !kv.allFree() {
			return fmt.Errorf("the undelivered prefill's hold is still there: %d holds, all blocks free %v", n, kv.allFree())
		}
		return nil
	})
	if holds.n != 1 {
		t.Fatalf("%d holds were made, want 1", holds.n)
	}
}
