package localcluster

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseReady(t *testing.T) {
	f, ok := parseReady("connexd ready member=router nats=nats://127.0.0.1:4222 backend=tcp data=127.0.0.1:1 role=router http=http://127.0.0.1:8000", connexdReady)
	if !ok || f["member"] != "router" || f["nats"] != "nats://127.0.0.1:4222" || f["http"] != "http://127.0.0.1:8000" || f["role"] != "router" {
		t.Errorf("connexd line: %v %v", f, ok)
	}
	f, ok = parseReady("connex-sim ready engine=decode-1 role=decode http=http://127.0.0.1:4000 member=decode-1", simReady)
	if !ok || f["engine"] != "decode-1" || f["http"] != "http://127.0.0.1:4000" {
		t.Errorf("sim line: %v %v", f, ok)
	}
	// A UCX address has no '=' problems: only the first '=' splits.
	f, _ = parseReady("connexd ready data=binary:9B:ab… x=a=b", connexdReady)
	if f["x"] != "a=b" {
		t.Errorf("x = %q", f["x"])
	}
	for _, line := range []string{"connexd stopped member=x", "connexd readyish", " connexd ready", "time=… connexd ready"} {
		if _, ok := parseReady(line, connexdReady); ok {
			t.Errorf("%q read as a ready line", line)
		}
	}
}

func TestHostPort(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8000": "127.0.0.1:8000", "nats://127.0.0.1:4222": "127.0.0.1:4222",
		"http://[::1]:80/x": "[::1]:80", "127.0.0.1:9": "127.0.0.1:9",
	} {
		if got := hostPort(in); got != want {
			t.Errorf("hostPort(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPollReady(t *testing.T) {
	var asks atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if asks.Add(1) < 3 {
			http.Error(w, "no decode engine yet", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pollReady(ctx, srv.URL+"/ready", time.Millisecond, nil); err != nil {
		t.Fatal(err)
	}
	if n := asks.Load(); n != 3 {
		t.Errorf("asked %d times, want 3", n)
	}
}

func TestPollReadyReportsLastAnswer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no decode engine yet", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := pollReady(ctx, srv.URL+"/ready", time.Millisecond, nil)
	if err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "no decode engine yet") {
		t.Errorf("err = %v, want the last 503 answer", err)
	}
	dead := make(chan struct{})
	close(dead)
	err = pollReady(context.Background(), srv.URL+"/ready", time.Hour, dead)
	if err == nil || !strings.Contains(err.Error(), "exited") {
		t.Errorf("err = %v, want 'exited'", err)
	}
}

func TestLineWriter(t *testing.T) {
	var got []string
	w := &lineWriter{line: func(s string) { got = append(got, s) }}
	for _, chunk := range []string{"conn", "exd ready a=1\r\nsecond", " line\n\nthird"} {
		if n, err := w.Write([]byte(chunk)); n != len(chunk) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	want := []string{"connexd ready a=1", "second line", ""}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("lines %q, want %q", got, want)
	}
}

func TestEnginesDiff(t *testing.T) {
	want := map[string]string{"prefill-0": "http://a", "decode-0": "http://b"}
	listed := []routerEngine{{EngineID: "decode-0", BaseURL: "http://b"}, {EngineID: "prefill-0", BaseURL: "http://a"},
		{EngineID: "decode-1", BaseURL: "http://c", Suspect: true}}
	if d := enginesDiff(listed, want); d != "" {
		t.Errorf("agreeing lists: %q", d)
	}
	listed = []routerEngine{{EngineID: "decode-0", BaseURL: "http://old"}, {EngineID: "decode-1", BaseURL: "http://c"}}
	d := enginesDiff(listed, want)
	for _, part := range []string{"does not list prefill-0", "lists decode-0 at http://old, it serves at http://b", "lists decode-1 that is not running"} {
		if !strings.Contains(d, part) {
			t.Errorf("diff %q lacks %q", d, part)
		}
	}
}
