package engines

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
)

func TestLiveness(t *testing.T) {
	refused := fmt.Errorf("dial tcp 127.0.0.1:1: connect: %w", syscall.ECONNREFUSED)
	timeout := errors.New("dial tcp 10.0.0.1:80: i/o timeout")
	steps := []struct {
		id, inst string
		err      error
		want     Verdict
		why      string
	}{
		{"d0", "a", refused, Unchanged, "never seen listening: it may register before it serves"},
		{"d0", "a", nil, Listening, "listening"},
		{"d0", "a", nil, Unchanged, "still listening"},
		{"d0", "a", timeout, Unchanged, "a timeout is slow or paused, not gone"},
		{"d0", "b", refused, Unchanged, "a new instance not yet seen listening"},
		{"d0", "a", refused, Gone, "seen listening, now refused: gone"},
		{"d0", "a", refused, Unchanged, "judged once"},
		{"d1", "x", nil, Listening, "listening"},
		{"d1", "y", nil, Listening, "a new instance listening"},
		{"d1", "y", refused, Gone, "gone"},
	}
	l := NewLiveness()
	for i, s := range steps {
		if got := l.Observe(s.id, s.inst, s.err); got != s.want {
			t.Fatalf("step %d (%s): verdict %v, want %v", i, s.why, got, s.want)
		}
	}
	l.Observe("d2", "y", nil)
	l.Forget(func(id string) bool { return id != "d2" })
	if l.Observe("d2", "y", refused) != Unchanged {
		t.Fatal("a forgotten engine was judged")
	}
}

func TestDialAddr(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8100": "127.0.0.1:8100",
		"http://engine.local":   "engine.local:80",
		"https://[::1]/x":       "[::1]:443",
		"::not a url":           "",
	} {
		if got := DialAddr(in); got != want {
			t.Errorf("DialAddr(%q) = %q, want %q", in, got, want)
		}
	}
}
