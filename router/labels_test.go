package router

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
)

// TestUnknownModelsAreNotLabels: model names no engine serves, and error
// codes an engine makes up, do not become series: 50 requests with distinct
// 4 KiB model names leave /metrics without any of them (they count under
// model="unknown"), and an engine's own error code counts as "other".
func TestUnknownModelsAreNotLabels(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill", status: 500, code: "made_up_by_the_engine"}).start()
	d := (&fakeEngine{t: t, id: "d", role: "decode"}).start()
	s := newTestRouter(t, p, d)
	name := func(i int) string { return fmt.Sprintf("zz%04d-%s", i, strings.Repeat("x", 4<<10)) }
	for i := 0; i < 50; i++ {
		resp, err := http.Post(s.URL()+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"`+name(i)+`","prompt":"a"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Fatalf("unknown model: %d", resp.StatusCode)
		}
	}
	resp, err := http.Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// A request is counted after its answer is written: wait for the last.
	var m string
	poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
		resp, err := http.Get(s.URL() + "/metrics")
		if err != nil {
			return err
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		m = string(data)
		if !strings.Contains(m, `model="m",status="500"} 1`) || !strings.Contains(m, `status="404"} 50`) {
			return fmt.Errorf("not all 51 requests counted yet")
		}
		return nil
	})
	if strings.Contains(m, "zz0000") || strings.Contains(m, "made_up_by_the_engine") || len(m) > 64<<10 {
		t.Fatalf("/metrics (%d bytes) carries client- or engine-chosen label values", len(m))
	}
	for _, want := range []string{
		`connex_router_requests_total{endpoint="/v1/completions",model="unknown",status="404"} 50`,
		`connex_router_errors_total{code="other"} 1`,
		`connex_router_requests_total{endpoint="/v1/completions",model="m",status="500"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestRouterCodesAreLabels: every code of the router's table (codes_gen.go)
// is a value of connex_router_errors_total's code label, including those a
// hand-kept list once missed (context_length_exceeded); anything else is
// "other".
func TestRouterCodesAreLabels(t *testing.T) {
	for _, c := range []string{CodeContextLength, CodeOverloaded, CodeKVLoadFailed, CodeUnauthorized} {
		if got := codeLabel(c); got != c {
			t.Errorf("codeLabel(%q) = %q", c, got)
		}
	}
	if got := codeLabel("made_up_by_the_engine"); got != labelOther {
		t.Errorf("an engine's own code is labelled %q, want %q", got, labelOther)
	}
}
