package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
)

// TestClientGoneDuringDecode: a client that hangs up while its decode leg
// starts (the engine has not sent a token, and may not have bound the
// hold yet) ends the request: the router hands the prefill hold back
// (client_gone), counts the request with status 499 and no error, and
// warns of no engine failure.
func TestClientGoneDuringDecode(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d := (&fakeEngine{t: t, id: "d", role: "decode", firstDelay: time.Minute, served: make(chan struct{})}).start()
	var (
		logs     poll.Buffer
		mu       sync.Mutex
		released []string
	)
	s, err := New(Config{
		Listen:  "127.0.0.1:0",
		Engines: func() []Engine { return []Engine{p.engine(), d.engine()} },
		Stall:   StallRule{Factor: 3, Floor: 50 * time.Millisecond, Cold: 200 * time.Millisecond, Ceiling: time.Second, FirstToken: 5 * time.Minute},
		ReleaseHold: func(_ context.Context, params json.RawMessage, rid string) error {
			mu.Lock()
			defer mu.Unlock()
			released = append(released, rid+" "+string(params))
			return nil
		},
		PrefillTimeout: 5 * time.Second, MaxResumes: 3, MaxBodyBytes: 1 << 20,
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":5,"stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		errc <- err
	}()
	<-d.served // the decode leg runs
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the client's request: %v, want canceled", err)
	}
	poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(released) == 0 {
			return fmt.Errorf("the router has not released the hold; log:\n%s", logs.String())
		}
		return nil
	})
	mu.Lock()
	if len(released) != 1 || !strings.Contains(released[0], `"transfer_id":"t1"`) {
		t.Errorf("releases %q, want one of transfer t1", released)
	}
	mu.Unlock()
	if out := logs.String(); strings.Contains(out, "level=WARN") || strings.Contains(out, "level=ERROR") {
		t.Errorf("a client leaving is no engine failure:\n%s", out)
	}
	poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		resp, err := http.Get(s.URL() + "/metrics")
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		m := string(b)
		if !strings.Contains(m, `connex_router_requests_total{endpoint="/v1/completions",model="m",status="499"} 1`) {
			return fmt.Errorf("no request counted with status 499:\n%s", m)
		}
		if !strings.Contains(m, `reason="client_gone"`) {
			return fmt.Errorf("no hold release counted as client_gone:\n%s", m)
		}
		if strings.Contains(m, "connex_router_errors_total{") {
			return fmt.Errorf("an error counted for a client that left:\n%s", m)
		}
		return nil
	})
}
