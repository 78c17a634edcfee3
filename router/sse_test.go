package router

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// drained is what a stream reader answers once the bytes written so far
// are read: a read past them would wait for the engine.
var drained = errors.New("would wait for the engine")

// pieces hands out a stream in the pieces it is given, then drained until
// the next piece is added.
type pieces struct{ p []string }

func (r *pieces) Read(b []byte) (int, error) {
	if len(r.p) == 0 {
		return 0, drained
	}
	n := copy(b, r.p[0])
	if r.p[0] = r.p[0][n:]; r.p[0] == "" {
		r.p = r.p[1:]
	}
	return n, nil
}

// TestSSEReaderEvents: data lines make events (several lines joined by a
// newline), comments, other fields and empty data are skipped, [DONE]
// ends the stream, and a stream that stops without it is an unexpected EOF.
func TestSSEReaderEvents(t *testing.T) {
	stream := ": hello\n\nretry: 10\n\ndata: {\"a\":1}\n\n\n\ndata:\n\ndata: x\r\ndata:y\r\n\r\nevent: e\nid: 3\ndata: last\n\ndata: [DONE]\n\n"
	s := newSSEReader(strings.NewReader(stream))
	for _, want := range []string{`{"a":1}`, "x\ny", "last"} {
		got, err := s.next()
		if err != nil || string(got) != want {
			t.Fatalf("next: %q %v, want %q", got, err, want)
		}
	}
	for range 2 { // the end is sticky: the reader went back to the pool
		if _, err := s.next(); err != errDone {
			t.Fatalf("at [DONE]: %v", err)
		}
	}
	s = newSSEReader(strings.NewReader("data: a\n\ndata: b"))
	if got, err := s.next(); err != nil || string(got) != "a" {
		t.Fatalf("next: %q %v", got, err)
	}
	if _, err := s.next(); err != io.ErrUnexpectedEOF {
		t.Fatalf("a stream cut mid-event: %v, want unexpected EOF", err)
	}
	// A line past the reader's 64 KiB buffer is read whole (TestSSELongLine:
	// up to maxEventBytes).
	s = newSSEReader(strings.NewReader("data: " + strings.Repeat("x", 70<<10) + "\n\n"))
	if got, err := s.next(); err != nil || len(got) != 70<<10 {
		t.Fatalf("a 70 KiB line: %d bytes, %v", len(got), err)
	}
}

// TestSSEReaderReady: ready says true only when next will not read from the
// engine, and says it whenever a whole event with data waits.
func TestSSEReaderReady(t *testing.T) {
	for _, tc := range []struct {
		pieces []string
		ready  []bool // after each next, up to the first true
	}{
		{[]string{"data: 1\n\ndata: 2\n\ndata: 3\n\n"}, []bool{true}},
		{[]string{"data: 1\n\ndata: 2\n", "\ndata: 3\n\n"}, []bool{false, true}},
		{[]string{"data: 1\n\n: keep-alive\n\n\n\n", "data: 2\n\n"}, []bool{false, false}},
		{[]string{"data: 1\n\ndata:\n\ndata: \n\n", "data: 2\n\n"}, []bool{false, false}},
		{[]string{"data: 1\r\n\r\ndata: 2\r\n\r\n", "data: 3\n\n"}, []bool{true}},
		{[]string{"data: 1\n\ndata: [DONE]\n\n"}, []bool{true}},
		{[]string{"data: 1\n\nda", "ta: 2\n\n"}, []bool{false, false}},
	} {
		r := &pieces{p: append([]string(nil), tc.pieces...)}
		s := newSSEReader(r)
		for i, want := range tc.ready {
			if _, err := s.next(); err != nil {
				t.Fatalf("%q: event %d: %v", tc.pieces, i, err)
			}
			got := s.ready()
			if got != want {
				t.Fatalf("%q: ready after event %d = %v, want %v", tc.pieces, i, got, want)
			}
			if got {
				// ready: the next event must come without a read past the
				// bytes in hand, however the rest is cut.
				rest := r.p
				r.p = nil
				if _, err := s.next(); err != nil && err != errDone {
					t.Fatalf("%q: ready after event %d, but next read on: %v", tc.pieces, i, err)
				}
				r.p = rest
			}
		}
	}
}

// TestSSELongLine: an engine's event line longer than the reader's 64 KiB
// buffer (the first chunk of a 12k-token prompt's answer carries its ids)
// is read whole; one past maxEventBytes is refused.
func TestSSELongLine(t *testing.T) {
	ids := strings.Repeat("123456,", 12000) // ~84 KB
	stream := "data: {\"ids\":[" + ids + "0]}\r\n\r\ndata: next\n\ndata: [DONE]\n\n"
	r := newSSEReader(strings.NewReader(stream))
	ev, err := r.next()
	if err != nil || string(ev) != "{\"ids\":["+ids+"0]}" {
		t.Fatalf("long event: %d bytes, %v", len(ev), err)
	}
	if ev, err := r.next(); err != nil || string(ev) != "next" {
		t.Fatalf("event after it: %q, %v", ev, err)
	}
	if _, err := r.next(); !errors.Is(err, errDone) {
		t.Fatalf("after [DONE]: %v", err)
	}
	huge := "data: " + strings.Repeat("x", maxEventBytes+1) + "\n\n"
	if _, err := newSSEReader(strings.NewReader(huge)).next(); err == nil || !strings.Contains(err.Error(), "than 4194304 bytes") {
		t.Fatalf("an event line past maxEventBytes: %v", err)
	}
}
