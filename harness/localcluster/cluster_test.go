package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestLocalCluster starts a small cluster of the real binaries (built from
// this tree), serves a completion through the router, crashes and restarts
// an engine, and checks that Close leaves no process behind.
func TestLocalCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	o := realOptions(ctx, t)
	c, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	for _, e := range c.Engines() {
		if code, body := get(t, e.URL+"/health"); code != http.StatusOK {
			t.Errorf("%s /health: %d %s", e.Name, code, body)
		}
	}
	if code, body := get(t, c.RouterURL()+"/v1/models"); code != http.StatusOK || !strings.Contains(body, `"connex-sim"`) {
		t.Errorf("/v1/models: %d %s", code, body)
	}
	first := complete(t, c.RouterURL())

	// An engine crashes and comes back under its name; the cluster serves
	// the same answer again.
	old, _ := c.PID("decode-0/engine")
	if err := c.Kill("decode-0/engine"); err != nil {
		t.Fatal(err)
	}
	if procState(old) != "gone" {
		t.Errorf("killed engine pid %d: %s", old, procState(old))
	}
	// The router drops it (its registration lapses) …
	if err := c.WaitEngines(ctx); err != nil {
		t.Fatal(err)
	}
	// … and lists it at its new URL once it is back.
	if err := c.Restart(ctx, "decode-0/engine"); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitEngines(ctx); err != nil {
		t.Fatal(err)
	}
	if again := complete(t, c.RouterURL()); again != first {
		t.Errorf("after restart the answer changed: %q, then %q", first, again)
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if kids := children(t); len(kids) != 0 {
		t.Errorf("processes left after Close: %v", kids)
	}
}

// realOptions are fast-engine options on the real binaries, built from
// this tree (the test is skipped with -short or without /proc; a binary
// that does not build fails it).
func realOptions(ctx context.Context, t *testing.T) Options {
	t.Helper()
	needProc(t)
	if testing.Short() {
		t.Skip("starts real processes")
	}
	bins, err := Build(ctx, t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	o := Defaults()
	o.Connexd, o.Sim = bins.Connexd, bins.Sim
	o.PrefillPerToken, o.DecodePerToken = 10*time.Microsecond, 1*time.Millisecond
	o.Log = &testLog{t: t}
	return o
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// complete asks the router for a short completion and returns its text.
func complete(t *testing.T, router string) string {
	t.Helper()
	text, _ := completion(t, router)
	return text
}

// completion asks the router for a short completion and returns its text
// and the decode engine that served it (X-Connex-Decode-Engine).
func completion(t *testing.T, router string) (text, decode string) {
	t.Helper()
	resp, err := http.Post(router+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"connex-sim","prompt":"local cluster","max_tokens":8}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &r); err != nil || resp.StatusCode != http.StatusOK || len(r.Choices) != 1 || r.Choices[0].Text == "" {
		t.Fatalf("completion: %d %s (%v)", resp.StatusCode, b, err)
	}
	return fmt.Sprint(r.Choices[0].Text), resp.Header.Get("X-Connex-Decode-Engine")
}
