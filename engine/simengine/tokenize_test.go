package simengine

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestSimTokenize(t *testing.T) {
	ts := newTestServer(t, newFakeKV(t, "e1", &holdTable{m: map[string]fakeHold{}}), 0)
	count := func(body string) (int, int) {
		t.Helper()
		status, out := post(t, ts.URL+"/tokenize", body)
		var r struct {
			Count       int      `json:"count"`
			MaxModelLen int      `json:"max_model_len"`
			Tokens      []uint32 `json:"tokens"`
		}
		if status == http.StatusOK {
			if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Tokens) != r.Count || r.MaxModelLen != 400 {
				t.Fatalf("%s: %s (%v)", body, out, err)
			}
		}
		return status, r.Count
	}
	// One token per byte, as generation counts it.
	if status, n := count(`{"model":"connex-sim","prompt":"héllo"}`); status != 200 || n != len(Encode("héllo")) {
		t.Errorf("prompt: %d %d, want 200 %d", status, n, len(Encode("héllo")))
	}
	msgs := []Message{{Role: "user", Content: "hi there"}}
	if status, n := count(`{"messages":[{"role":"user","content":"hi there"}]}`); status != 200 || n != len(Encode(RenderChat(msgs))) {
		t.Errorf("messages: %d %d, want 200 %d", status, n, len(Encode(RenderChat(msgs))))
	}
	for body, want := range map[string]int{
		`{"model":"other","prompt":"x"}`: http.StatusNotFound,
		`{"prompt":""}`:                  http.StatusBadRequest,
		`{}`:                             http.StatusBadRequest,
		`[1,2]`:                          http.StatusBadRequest,
		`{"messages":[]}`:                http.StatusBadRequest,
	} {
		if status, _ := count(body); status != want {
			t.Errorf("%s: %d, want %d", body, status, want)
		}
	}
	resp, err := http.Get(ts.URL + "/tokenize")
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /tokenize: %v %v", resp, err)
	}
	resp.Body.Close()

	off := NewServer(Config{KV: newFakeKV(t, "e1", &holdTable{m: map[string]fakeHold{}}), EngineID: "e2", Role: "decode", Model: "connex-sim", MaxModelLen: 400, NoTokenize: true})
	ts2 := httptest.NewServer(off.Handler())
	defer ts2.Close()
	if status, body := post(t, ts2.URL+"/tokenize", `{"prompt":"x"}`); status != http.StatusNotFound || !strings.Contains(body, "no route") {
		t.Errorf("NoTokenize: %d %s, want 404", status, body)
	}
}
