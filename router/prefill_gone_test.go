package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
)

// TestClientGoneDuringPrefill: a client that hangs up while its prefill
// leg runs ends the request there. The engine did not fail, so the router
// neither warns that it did nor sends the prompt to a second prefill engine
// for nobody; the request is counted with status 499, not as an engine
// error.
func TestClientGoneDuringPrefill(t *testing.T) {
	var hits atomic.Int32
	legs := make(chan struct{}, 2)
	slowPrefill := func(id string) *fakeEngine {
		f := &fakeEngine{t: t, id: id, role: "prefill"}
		f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/health" {
				w.WriteHeader(http.StatusOK)
				return
			}
			_, _ = io.Copy(io.Discard, r.Body) // then Go notices the client's leaving
			hits.Add(1)
			legs <- struct{}{}
			<-r.Context().Done() // a long prompt's prefill, outlived by nobody
		}))
		t.Cleanup(f.srv.Close)
		return f
	}
	p1, p2 := slowPrefill("p1"), slowPrefill("p2")
	d := (&fakeEngine{t: t, id: "d", role: "decode"}).start()
	var logs poll.Buffer
	s, err := New(Config{
		Listen: "127.0.0.1:0",
		Engines: func() []Engine {
			return []Engine{p1.engine(), p2.engine(), d.engine()}
		},
		Stall:          StallRule{Factor: 3, Floor: 50 * time.Millisecond, Cold: 200 * time.Millisecond, Ceiling: time.Second, FirstToken: 5 * time.Second},
		PrefillTimeout: 5 * time.Second, MaxResumes: 3, MaxBodyBytes: 1 << 20,
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"a long prompt","max_tokens":5}`))
	req.Header.Set("Content-Type", "application/json")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-legs // the prefill leg runs
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the client's request: %v, want canceled", err)
	}
	poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		if !strings.Contains(logs.String(), "client left during the prefill") {
			return fmt.Errorf("the router has not noted the client's leaving; log:\n%s", logs.String())
		}
		return nil
	})
	if n := hits.Load(); n != 1 {
		t.Errorf("%d prefill legs, want 1 (none for a client that left)", n)
	}
	if out := logs.String(); strings.Contains(out, "level=WARN") || strings.Contains(out, "level=ERROR") {
		t.Errorf("a client leaving is no engine failure:\n%s", out)
	}
	// The request is counted once its handler returns.
	untilMetrics(t, s, func(m string) error {
		if !strings.Contains(m, `connex_router_requests_total{endpoint="/v1/completions",model="m",status="499"} 1`) {
			return fmt.Errorf("no request counted with status 499:\n%s", m)
		}
		if strings.Contains(m, "connex_router_errors_total{") {
			return fmt.Errorf("an error counted for a client that left:\n%s", m)
		}
		return nil
	})
}
