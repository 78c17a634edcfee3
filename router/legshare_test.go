package router

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
)

// chunkOf parses an engine chunk for the tests.
func chunkOf(t *testing.T, data string) *engineChunk {
	t.Helper()
	ch, err := parseChunk([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// TestLegShareTakesOnlyPlainTokensInOrder: the reader relays a chunk only
// when it is plain tokens, the leg is on and nothing it sent to the leg's
// goroutine waits there; a relay that ends the answer stops it relaying.
func TestLegShareTakesOnlyPlainTokensInOrder(t *testing.T) {
	var got []string
	sh := &legShare{relaying: true, relay: func(ch *engineChunk, more bool) bool {
		got = append(got, fmt.Sprintf("%s more=%v", ch.text(), more))
		return ch.text() != "end"
	}}
	plain := chunkOf(t, `{"choices":[{"index":0,"text":"a","token_ids":[1]}]}`)
	for _, c := range []struct {
		name string
		ev   legEvent
	}{
		{"an error event", legEvent{err: errDone}},
		{"the answer's headers", legEvent{resp: &upResponse{}}},
		{"an error chunk", legEvent{chunk: chunkOf(t, `{"error":{"message":"no","code":500}}`)}},
		{"a Connex field", legEvent{chunk: chunkOf(t, `{"choices":[{"index":0,"text":"a"}],"connex":{"kv_load":"pulled"}}`)}},
		{"no choice (usage)", legEvent{chunk: chunkOf(t, `{"choices":[],"usage":{"completion_tokens":1}}`)}},
	} {
		if o := sh.take(c.ev); o != notRelayed {
			t.Errorf("%s: take = %v, want notRelayed", c.name, o)
		}
	}
	if o := sh.take(legEvent{chunk: plain, more: true}); o != relayed {
		t.Fatalf("plain tokens: take = %v, want relayed", o)
	}
	// An event sent to the leg's goroutine and not handled yet: what
	// follows goes there too.
	sh.sent(1)
	if o := sh.take(legEvent{chunk: plain}); o != notRelayed {
		t.Fatalf("plain tokens behind a queued event: take = %v, want notRelayed", o)
	}
	sh.mu.Lock()
	sh.queued-- // the leg's goroutine handled it
	sh.mu.Unlock()
	if o := sh.take(legEvent{chunk: plain}); o != relayed {
		t.Fatalf("plain tokens once the queue is empty: take = %v, want relayed", o)
	}
	if o := sh.take(legEvent{chunk: chunkOf(t, `{"choices":[{"index":0,"text":"end","token_ids":[2]}]}`)}); o != relayEnded {
		t.Fatalf("a chunk that ends the answer: take = %v, want relayEnded", o)
	}
	if o := sh.take(legEvent{chunk: plain}); o != notRelayed {
		t.Fatalf("after the answer ended: take = %v, want notRelayed", o)
	}
	if want := []string{"a more=true", "a more=false", "end more=false"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("relayed %q, want %q", got, want)
	}
	sh.relaying, got = false, nil // the leg ended
	if o := sh.take(legEvent{chunk: plain}); o != notRelayed || got != nil {
		t.Fatalf("after the leg ended: take = %v, relayed %q", o, got)
	}
}

// TestReadLegKeepsTheEnginesOrder drives readLeg against an engine whose
// chunks leave one at a time when the test says, the test playing the leg's
// goroutine: a plain chunk read while an event sent to the leg (the answer's
// headers, a chunk with a Connex field) waits unhandled follows it there;
// with the queue empty the reader relays it; a relay that ends the answer
// sends relayEnded, and everything after it goes to the leg.
func TestReadLegKeepsTheEnginesOrder(t *testing.T) {
	chunks := []string{
		`{"choices":[{"index":0,"text":"1","token_ids":[1]}]}`,
		`{"choices":[{"index":0,"text":"2","token_ids":[2]}]}`,
		`{"choices":[{"index":0,"text":"3","token_ids":[3]}],"connex":{"kv_load":"pulled"}}`,
		`{"choices":[{"index":0,"text":"4","token_ids":[4]}]}`,
		`{"choices":[{"index":0,"text":"end","token_ids":[5]}]}`,
		`{"choices":[{"index":0,"text":"6","token_ids":[6]}]}`,
	}
	// The engine answers its headers at once, then sends each chunk when
	// the test passes it through gate, then [DONE].
	gate := make(chan struct{})
	e := &fakeEngine{t: t, id: "d", role: "decode"}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for _, c := range chunks {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
			fmt.Fprintf(w, "data: %s\n\n", c)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(e.srv.Close)
	s := newTestRouter(t, e)
	pass := func() {
		select {
		case gate <- struct{}{}:
		case <-time.After(10 * time.Second):
			t.Fatal("the engine did not take the next chunk")
		}
	}
	var mu sync.Mutex
	var order []string
	record := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	recorded := func() string { mu.Lock(); defer mu.Unlock(); return strings.Join(order, " ") }
	sh := &legShare{relaying: true, relay: func(ch *engineChunk, _ bool) bool {
		record("reader:" + ch.text())
		return ch.text() != "end" // a stop string matched
	}}
	events := make(chan legEvent, 16)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // runs before the engine's Close: the leg's connection ends
	go s.readLeg(ctx, s.cfg.Engines()[0].Info.GetBaseUrl()+"/v1/completions", []byte(`{"prompt":"x"}`), "d", events, sh)
	// handle is the leg's goroutine: it takes n events and handles them.
	handle := func(n int) {
		for range n {
			var ev legEvent
			select {
			case ev = <-events:
			case <-time.After(10 * time.Second):
				t.Fatalf("no event; so far: %s", recorded())
			}
			sh.mu.Lock()
			sh.queued--
			switch {
			case ev.resp != nil:
				record("leg:resp")
			case ev.err == errDone:
				record("leg:done")
			case ev.err != nil:
				record("leg:" + ev.err.Error())
			case ev.relayEnded:
				record("leg:relayEnded")
			default:
				record("leg:" + ev.chunk.text())
			}
			sh.mu.Unlock()
		}
	}
	waitFor := func(what string, cond func() bool) {
		poll.Until(t, 10*time.Second, time.Millisecond, func() error {
			if !cond() {
				return fmt.Errorf("%s; so far: %s", what, recorded())
			}
			return nil
		})
	}
	queued := func(n int) func() bool { return func() bool { return len(events) == n } }
	waitFor("the answer's headers sent to the leg", queued(1))
	pass()
	waitFor("chunk 1 sent to the leg behind the headers", queued(2))
	handle(2)
	pass()
	waitFor("chunk 2 relayed by the reader", func() bool { return strings.HasSuffix(recorded(), "reader:2") })
	pass()
	waitFor("chunk 3 (a Connex field) sent to the leg", queued(1))
	pass()
	waitFor("chunk 4 sent to the leg behind chunk 3", queued(2))
	handle(2)
	pass()
	waitFor("the end of the answer relayed, then told to the leg", queued(1))
	pass()
	// Chunk 6 and [DONE] leave the engine back to back.
	waitFor("chunk 6 sent to the leg after the answer ended", func() bool { return len(events) >= 2 })
	handle(3) // relayEnded, chunk 6, [DONE]
	if got, want := recorded(), "leg:resp leg:1 reader:2 leg:3 leg:4 reader:end leg:relayEnded leg:6 leg:done"; got != want {
		t.Fatalf("handled %q, want %q", got, want)
	}
}

// TestLegsReaderRelaysTheTokens: through the router, a paced stream's
// tokens are relayed by the leg's reader (the path without a hand-off is in
// use), and the client gets every one of them, in order.
func TestLegsReaderRelaysTheTokens(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d := (&fakeEngine{t: t, id: "d", role: "decode", gap: 2 * time.Millisecond}).start()
	s := newTestRouter(t, p, d)
	texts, done, errs := stream(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":20,"stream":true}`)
	if !done || len(errs) > 0 || strings.Join(texts, "") != strings.Join(want(20), "") {
		t.Fatalf("texts %q done %v errs %v; want %q once", texts, done, errs, want(20))
	}
	if n := s.readerRelays.Load(); n == 0 {
		t.Fatal("no chunk was relayed by the leg's reader: every token took the hand-off to the leg's goroutine")
	}
}
