package router

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
)

func limitedRouter(t *testing.T, cfg Config, engines ...*fakeEngine) *Server {
	t.Helper()
	cfg.Listen = "127.0.0.1:0"
	cfg.Engines = func() []Engine {
		var out []Engine
		for _, e := range engines {
			out = append(out, e.engine())
		}
		return out
	}
	cfg.Stall = StallRule{Factor: 8, Floor: time.Hour, Cold: time.Hour, Ceiling: time.Hour, FirstToken: time.Hour}
	cfg.PrefillTimeout, cfg.MaxResumes, cfg.MaxBodyBytes = 5*time.Second, 3, 1<<20
	cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// answeredWithin reports whether the server answers or closes conn within
// d: a read that returns (bytes, EOF or reset) rather than timing out.
func answeredWithin(conn net.Conn, d time.Duration) bool {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	_, err := conn.Read(make([]byte, 1))
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// TestLongStreamOutlivesReadTimeout: the read timeout bounds the request,
// not the answer: a stream longer than it is relayed whole.
func TestLongStreamOutlivesReadTimeout(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d := (&fakeEngine{t: t, id: "d", role: "decode", gap: 50 * time.Millisecond}).start()
	s := limitedRouter(t, Config{ReadTimeout: 200 * time.Millisecond}, p, d)
	texts, done, errs := stream(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":10,"stream":true}`)
	if !done || len(errs) > 0 || strings.Join(texts, "") != strings.Join(want(10), "") {
		t.Fatalf("a 500 ms stream behind a 200 ms read timeout: texts %q done %v errs %v", texts, done, errs)
	}
}

// TestSlowBodyIsCut: a client that sends its headers and then its body a
// trickle at a time is answered (or dropped) once router_read_timeout
// passes, instead of holding a connection and a goroutine for ever.
func TestSlowBodyIsCut(t *testing.T) {
	s := limitedRouter(t, Config{ReadTimeout: 300 * time.Millisecond})
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
	start := time.Now()
	if !answeredWithin(conn, 5*time.Second) {
		t.Fatalf("a body stalled after 9 of 1000 bytes still holds its connection after %s (read timeout 300ms)", time.Since(start).Round(time.Millisecond))
	}
}

// TestConnectionCap: with router_max_conns connections open and idle, the
// next connection is not served until one of them closes (it waits in the
// kernel's accept queue, using no descriptor of the router's).
func TestConnectionCap(t *testing.T) {
	s := limitedRouter(t, Config{MaxConns: 4})
	addr := strings.TrimPrefix(s.URL(), "http://")
	var idle []net.Conn
	for i := 0; i < 4; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle = append(idle, c)
	}
	// Each idle connection holds a slot once the router accepted it: a
	// request on it is served.
	for _, c := range idle[:3] {
		fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
			t.Fatal(err)
		}
	}
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	fmt.Fprintf(extra, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	if answeredWithin(extra, 300*time.Millisecond) {
		t.Fatal("a fifth connection was served while four (router_max_conns) were open")
	}
	idle[0].Close()
	_ = extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(extra), nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("after a slot freed: %v %v", resp, err)
	}
}

// TestAdmissionControl: beyond router_max_in_flight completions the router
// answers 503 overloaded with Retry-After and an OpenAI error body, and
// admits again once a request ends.
func TestAdmissionControl(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d := (&fakeEngine{t: t, id: "d", role: "decode", failAfter: 1, hang: true}).start()
	s := limitedRouter(t, Config{MaxInFlight: 2}, p, d)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := 0; i < 2; i++ {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/completions",
			strings.NewReader(`{"model":"m","prompt":"abc","max_tokens":5,"stream":true}`))
		go func() {
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		d.mu.Lock()
		defer d.mu.Unlock()
		if len(d.bodies) < 2 {
			return fmt.Errorf("%d decode legs running, want 2", len(d.bodies))
		}
		return nil
	})
	resp, err := http.Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(`{"model":"nope","prompt":"a"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), `"code":"`+CodeOverloaded+`"`) ||
		!strings.Contains(string(body), `"type":"service_unavailable"`) {
		t.Fatalf("third request: %d Retry-After %q %s; want 503 overloaded", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	cancel() // the two clients go away
	poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
		resp, err := http.Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(`{"model":"nope","prompt":"a"}`))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			return fmt.Errorf("status %d, want 404 once admitted", resp.StatusCode)
		}
		return nil
	})
}
