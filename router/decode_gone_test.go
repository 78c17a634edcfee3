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

	cancel, errc := streamToCancel(t, s, "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":5,"stream":true}`)
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
	untilMetrics(t, s, func(m string) error {
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

// TestClientGoneDuringTheGrant: a client that leaves while the router asks
// the next engine's member for its grant ends the request as gone (499, the
// hold handed back), not as a refused grant followed by more grants and a
// failed resume.
func TestClientGoneDuringTheGrant(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&fakeEngine{t: t, id: "d1", role: "decode", failAfter: 2}).start()
	d2 := (&fakeEngine{t: t, id: "d2", role: "decode"}).start()
	d3 := (&fakeEngine{t: t, id: "d3", role: "decode"}).start()
	granting := make(chan struct{}, 4)
	var (
		logs   poll.Buffer
		mu     sync.Mutex
		grants int
	)
	s, err := New(Config{
		Listen:  "127.0.0.1:0",
		Engines: func() []Engine { return []Engine{p.engine(), d1.engine(), d2.engine(), d3.engine()} },
		Stall:   StallRule{Factor: 3, Floor: 50 * time.Millisecond, Cold: 200 * time.Millisecond, Ceiling: time.Second, FirstToken: 5 * time.Second},
		Authorize: func(ctx context.Context, _ Engine, _ string) error {
			mu.Lock()
			grants++
			mu.Unlock()
			granting <- struct{}{}
			<-ctx.Done() // a member slow to answer; the client leaves meanwhile
			return ctx.Err()
		},
		ReleaseHold:    func(context.Context, json.RawMessage, string) error { return nil },
		PrefillTimeout: 5 * time.Second, MaxResumes: 3, MaxBodyBytes: 1 << 20,
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	cancel, errc := streamToCancel(t, s, "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":5,"stream":true}`)
	<-granting
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the client's request: %v, want canceled", err)
	}
	untilMetrics(t, s, func(m string) error {
		if !strings.Contains(m, `connex_router_requests_total{endpoint="/v1/completions",model="m",status="499"} 1`) {
			return fmt.Errorf("no request counted with status 499:\n%s", m)
		}
		return nil
	})
	mu.Lock()
	n := grants
	mu.Unlock()
	if n != 1 {
		t.Errorf("%d grants asked, want 1 (none after the client left)", n)
	}
	if out := logs.String(); strings.Contains(out, "refused the router's grant") || strings.Contains(out, "level=ERROR") {
		t.Errorf("a client leaving during the grant read as a refusal:\n%s", out)
	}
}

// untilMetrics polls the router's /metrics until check accepts them.
func untilMetrics(t *testing.T, s *Server, check func(m string) error) {
	t.Helper()
	poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		resp, err := http.Get(s.URL() + "/metrics")
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return check(string(b))
	})
}

// streamToCancel sends body to the router's path as a client that will
// hang up: the request's error comes on the channel once cancel is called.
func streamToCancel(t *testing.T, s *Server, path, body string) (cancel context.CancelFunc, errc <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	ch := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		ch <- err
	}()
	return cancel, ch
}
