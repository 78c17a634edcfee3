package e2e

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// TestGracefulStopLogsNoError: a cluster of real processes that served
// requests, then lost one decode member to a graceful stop (SIGTERM, as a
// rolling upgrade does) while the rest ran on, then stopped as `make run`
// stops on Ctrl-C (localcluster.Close: engines, connexds, router), wrote no
// ERROR line in any process's output. A peer that leaves on purpose is not
// a fault (protoactor's remote reports the closed streams as "EndpointWriter
// lost connection"); a peer that dies still is (daemon/liblog_test.go).
// And no line of any process names an attribute twice.
func TestGracefulStopLogsNoError(t *testing.T) {
	var logs safeBuffer
	c := startProduct(t, func(o *localcluster.Options) {
		o.Log = io.MultiWriter(o.Log, &logs)
		o.Decode = 3
		o.DecodePerToken = 2 * time.Millisecond
	})
	waitEngines(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := c.RouterURL() + "/v1/completions"
	// Requests spread over the decode engines: holds, pulls and request
	// state put traffic on every member's connections.
	for i := range 6 {
		got, err := postStream(ctx, url, completion("a request before the stop", 8+i), nil)
		if err != nil || got.status != 200 || got.dones != 1 {
			t.Fatalf("request %d: %v %+v", i, err, got)
		}
	}
	if err := c.Term("decode-2"); err != nil {
		t.Fatal(err)
	}
	// The others serve on after the member left.
	if got, err := postStream(ctx, url, completion("a request after one member left", 8), nil); err != nil || got.status != 200 {
		t.Fatalf("after decode-2 left: %v %+v", err, got)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	var errs, repeats []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "level=ERROR") {
			errs = append(errs, l)
		}
		if k := repeatedKey(l); k != "" {
			repeats = append(repeats, k+": "+l)
		}
	}
	// connex-sim once wrote "engine=decode-0 engine=decode-0".
	if len(repeats) > 0 {
		t.Errorf("%d lines name an attribute twice:\n%s", len(repeats), strings.Join(repeats, "\n"))
	}
	if len(errs) > 0 {
		t.Fatalf("a graceful stop logged %d ERROR lines:\n%s", len(errs), strings.Join(errs, "\n"))
	}
	if !strings.Contains(out, "connexd stopped member=router") || !strings.Contains(out, "connexd stopped member=decode-2") {
		t.Fatalf("the processes did not report their stop; output:\n%s", tail(out, 4000))
	}
	t.Logf("%d lines, none at ERROR; protoactor's lost-connection reports (kept at INFO): %d, %d of them after a peer's graceful_stop",
		strings.Count(out, "\n"), strings.Count(out, "EndpointWriter lost connection"), strings.Count(out, `graceful_stop`))
}

// repeatedKey returns the first key that a logfmt line (slog's text
// handler, after localcluster's "name | " prefix) has twice, or "".
func repeatedKey(line string) string {
	if i := strings.Index(line, "| "); i >= 0 {
		line = line[i+2:]
	}
	seen := map[string]bool{}
	for line != "" {
		line = strings.TrimLeft(line, " ")
		eq := strings.IndexByte(line, '=')
		if eq <= 0 || strings.ContainsAny(line[:eq], " \"") {
			return "" // not key=value: a plain line (a ready line's prose)
		}
		key := line[:eq]
		if seen[key] {
			return key
		}
		seen[key] = true
		line = line[eq+1:]
		if strings.HasPrefix(line, `"`) {
			// A quoted value: up to the first quote not escaped.
			i := 1
			for i < len(line) && line[i] != '"' {
				if line[i] == '\\' {
					i++
				}
				i++
			}
			line = line[min(i+1, len(line)):]
		} else if sp := strings.IndexByte(line, ' '); sp >= 0 {
			line = line[sp:]
		} else {
			line = ""
		}
	}
	return ""
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// TestRepeatedKey pins the line check TestGracefulStopLogsNoError relies on.
func TestRepeatedKey(t *testing.T) {
	for line, want := range map[string]string{
		`decode-0/engine  | time=2026-12-03T21:30:11Z level=INFO msg="decode leg loaded" engine=decode-0 engine=decode-0`: "engine",
		`router | time=x level=WARN msg="a \"quoted\" engine=x" engine=y err="e: engine=z"`:                               "",
		`router | level=INFO msg=x a=1 b=2 a=3`:                                                                           "a",
		`connex-sim ready engine=decode-0 role=decode`:                                                                    "",
		`connexd stopped member=router`:                                                                                   "",
	} {
		if got := repeatedKey(line); got != want {
			t.Errorf("repeatedKey(%q) = %q, want %q", line, got, want)
		}
	}
}
