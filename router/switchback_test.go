package router

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
)

// A leg given up (stalled, its engine left) stays open while the request
// resumes elsewhere; if it finishes its answer before the resumed leg
// delivers, the router relays that answer instead (legSwitchBack) — never
// an error or an aborted answer (retired.go).

// TestGivenUpLegThatFinishesFirstIsRelayed: an engine given up for a stall
// that was only late (starved for 300 ms) finishes its answer while the
// resumed leg is still loading (2 s): the router relays the old engine's
// answer — an engine that finishes may release its hold before the new
// engine's takeover, leaving it nothing to pull — and leaves the new leg.
// The resumed engine's tokens would read " v…".
func TestGivenUpLegThatFinishesFirstIsRelayed(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&fakeEngine{t: t, id: "d1", role: "decode", pauseAt: 4, pause: 300 * time.Millisecond, pauseHealth: true}).start()
	d2 := (&fakeEngine{t: t, id: "d2", role: "decode", firstDelay: 2 * time.Second, tag: "v"}).start()
	s := newTestRouter(t, p, d1, d2) // stall window 200 ms
	texts, done, errs := stream(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":10,"stream":true}`)
	if !done || len(errs) > 0 || strings.Join(texts, "") != strings.Join(want(10), "") {
		t.Fatalf("texts %q done %v errs %v; want d1's %q once", texts, done, errs, want(10))
	}
	if n := counted(t, s, "connex_router_resumes_total"); n != 1 {
		t.Fatalf("%v resumes, want 1 (the one given up)", n)
	}
	if n := counted(t, s, "connex_router_false_resumes_total"); n != 1 {
		t.Fatalf("%v false resumes, want 1", n)
	}
	// The resumed leg is closed only once d2 has answered: left while it
	// starts the request, an engine may keep it alive.
	poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
		d2.mu.Lock()
		defer d2.mu.Unlock()
		if s.busySnapshot()["d2"] != 0 || d2.serving != 0 {
			return fmt.Errorf("the resumed leg on d2 is still open")
		}
		return nil
	})
	d2.mu.Lock()
	defer d2.mu.Unlock()
	if len(d2.bodies) != 1 || d2.leftMidStart {
		t.Fatalf("%d legs on d2 (want the resume), left while starting: %v", len(d2.bodies), d2.leftMidStart)
	}
}

// TestEngineErrorIsNoAnswerToSwitchBackTo: an engine whose stream answers
// an error event and then [DONE] (vLLM's stream when a request fails inside
// it, e.g. its request.start timed out and its KV load failed) is given up
// for engine_error; that [DONE] ends an error, not an answer, so the router
// does not switch back to it (the client got an empty stream: CI, vllm
// bench serve, 2 of 24 "never received a valid chunk") but relays the
// resumed leg. Both forms of vLLM's error event count.
func TestEngineErrorIsNoAnswerToSwitchBackTo(t *testing.T) {
	for _, form := range []string{"nested", "flat"} {
		t.Run(form, func(t *testing.T) {
			p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
			d1 := (&fakeEngine{t: t, id: "d1", role: "decode", streamError: form}).start()
			d2 := (&fakeEngine{t: t, id: "d2", role: "decode", firstDelay: 200 * time.Millisecond, tag: "v"}).start()
			s := newTestRouter(t, p, d1, d2)
			texts, done, errs := stream(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":10,"stream":true}`)
			var wantV []string
			for i := range 10 {
				wantV = append(wantV, fmt.Sprintf(" v%d", 1000+i))
			}
			if !done || len(errs) > 0 || strings.Join(texts, "") != strings.Join(wantV, "") {
				t.Fatalf("texts %q done %v errs %v; want d2's %q", texts, done, errs, wantV)
			}
		})
	}
}

// TestAbortedLegIsNoAnswerToSwitchBackTo: a late engine given up for a
// stall that ends its answer with finish_reason "abort" (it dropped the
// request) did not finish it: the router relays the resumed leg, not the
// aborted one.
func TestAbortedLegIsNoAnswerToSwitchBackTo(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&fakeEngine{t: t, id: "d1", role: "decode", pauseAt: 4, pause: 300 * time.Millisecond, pauseHealth: true, finish: "abort"}).start()
	d2 := (&fakeEngine{t: t, id: "d2", role: "decode", firstDelay: 2 * time.Second, tag: "v"}).start()
	s := newTestRouter(t, p, d1, d2) // stall window 200 ms
	texts, done, errs := stream(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":10,"stream":true}`)
	got := strings.Join(texts, "")
	if !done || len(errs) > 0 || !strings.HasPrefix(got, strings.Join(want(4), "")) || !strings.HasSuffix(got, " v1009") {
		t.Fatalf("texts %q done %v errs %v; want d1's first 4 tokens, then d2's", texts, done, errs)
	}
}

// TestSwitchBackKeepsEveryTokenID: the stream is given up right after a
// token whose text the engine held back (mid-character), so the resume
// point expects the new leg to regenerate it and skips one id; when the
// given-up leg finishes first and its answer is relayed instead, that skip
// must not eat the old leg's next id (1004 was lost, usage one short).
func TestSwitchBackKeepsEveryTokenID(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&fakeEngine{t: t, id: "d1", role: "decode", pauseAt: 4, pause: 300 * time.Millisecond, pauseHealth: true,
		withhold: map[int]bool{1003: true}}).start()
	d2 := (&fakeEngine{t: t, id: "d2", role: "decode", firstDelay: 2 * time.Second, tag: "v"}).start()
	s := newTestRouter(t, p, d1, d2)
	a := streamAnswer(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":10,"stream":true,"return_token_ids":true}`)
	var want []int
	for i := range 10 {
		want = append(want, 1000+i)
	}
	if len(a.ids) != len(want) {
		t.Fatalf("token ids %v, want %v", a.ids, want)
	}
	for i := range want {
		if a.ids[i] != want[i] {
			t.Fatalf("token ids %v, want %v", a.ids, want)
		}
	}
}

// TestSwitchBackKeepsTheGivenUpLegsSkip: d1 dies inside a UTF-8 character
// (it relayed the ids of 1002 and 1003 but not their text), so the resume
// on d2 starts at 1002 and skips the two ids the client has. d2 relays
// 1002 and stalls; the router gives it up for d3 (slow to start) and d2
// then finishes first: the switch back goes on with d2's own skip (one id
// left), not none, so the client gets each id once.
func TestSwitchBackKeepsTheGivenUpLegsSkip(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d1 := (&fakeEngine{t: t, id: "d1", role: "decode", failAfter: 4, withhold: map[int]bool{1002: true, 1003: true}}).start()
	d2 := (&fakeEngine{t: t, id: "d2", role: "decode", pauseAt: 1, pause: 300 * time.Millisecond, pauseHealth: true}).start()
	d3 := (&fakeEngine{t: t, id: "d3", role: "decode", firstDelay: 2 * time.Second, tag: "v"}).start()
	s := newTestRouter(t, p, d1, d2, d3)
	a := streamAnswer(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"abc","max_tokens":10,"stream":true,"return_token_ids":true}`)
	if len(a.errs) > 0 {
		t.Fatalf("errors %v", a.errs)
	}
	if got, want := strings.Join(a.texts, ""), strings.Join(want(10), ""); got != want || a.dones != 1 {
		t.Fatalf("text %q (%d [DONE]), want %q once", got, a.dones, want)
	}
	for i, id := range a.ids {
		if id != 1000+i || len(a.ids) != 10 {
			t.Fatalf("token ids %v: want 1000..1009 once each", a.ids)
		}
	}
	if n := counted(t, s, "connex_router_false_resumes_total"); n != 1 {
		t.Fatalf("%v false resumes, want 1 (d2 given up, then relayed)", n)
	}
}
