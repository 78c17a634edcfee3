package simengine

import (
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/connex/connex/harness/poll"
)

// TestLinesNameTheEngineOnce: the server adds engine=<id> to each of its
// lines itself, so a line names the engine exactly once, whatever the line
// (connex-sim logged "engine=decode-0 engine=decode-0" when both it and the
// server added it, and some lines named no engine).
func TestLinesNameTheEngineOnce(t *testing.T) {
	var out poll.Buffer
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	holds := &holdTable{m: map[string]fakeHold{}}
	serve := func(kv KV, id string) string {
		s := NewServer(Config{KV: kv, EngineID: id, Model: "connex-sim", MaxModelLen: 400, Log: log})
		ts := httptest.NewServer(s.Handler())
		t.Cleanup(ts.Close)
		return ts.URL
	}
	pre, dec := serve(newFakeKV(t, "p", holds), "prefill-7"), serve(newFakeKV(t, "d", holds), "decode-7")
	// A rejected request (debug), and a decode leg that loads its KV (info).
	if status, body := post(t, dec+"/v1/completions", `{"prompt":"x","max_tokens":-1}`); status != 400 {
		t.Fatalf("a bad request: %d %s", status, body)
	}
	params := prefillLeg(t, pre, `"a prompt"`)
	if status, body := post(t, dec+"/v1/completions", `{"prompt":"a prompt","max_tokens":2,"kv_transfer_params":`+params+`}`); status != 200 {
		t.Fatalf("decode leg: %d %s", status, body)
	}
	text := out.String()
	for _, want := range []string{"request rejected", "decode leg loaded"} {
		if !strings.Contains(text, want) {
			t.Fatalf("no %q line:\n%s", want, text)
		}
	}
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		if n := strings.Count(l, " engine="); n != 1 {
			t.Errorf("%d engine attributes in %q, want 1", n, l)
		}
	}
}
