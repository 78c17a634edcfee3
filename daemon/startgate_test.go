package daemon

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
)

// outcomes records what a startGate told each awaiting pull.
type outcomes struct {
	got map[string][]error
}

func (o *outcomes) fn(name string) func(error) {
	return func(err error) { o.got[name] = append(o.got[name], err) }
}

// want checks that name was told exactly once, with code (0: ok).
func (o *outcomes) want(t *testing.T, name string, code api.Code) {
	t.Helper()
	errs := o.got[name]
	if len(errs) != 1 {
		t.Fatalf("%s told %d times (%v), want once", name, len(errs), errs)
	}
	if got := api.CodeOf(errs[0]); got != code {
		t.Fatalf("%s told %v (code %d), want code %d", name, errs[0], got, code)
	}
}

func (o *outcomes) none(t *testing.T, name string) {
	t.Helper()
	if errs := o.got[name]; len(errs) != 0 {
		t.Fatalf("%s told %v before its start ended", name, errs)
	}
}

// TestStartGate: a pull sent beside its request's start reads when the
// start is answered, in whichever order the two arrive; it fails with the
// start's code, or with a timeout when no start comes, or when one in
// flight outlasts the pull's deadline; one engine's start, or an earlier
// leg's, settles nothing of another pull; old outcomes are forgotten; a
// stopping connexd fails what waits.
func TestStartGate(t *testing.T) {
	fc := clock.NewFake(time.Unix(1000, 0))
	g := newStartGate(fc)
	o := &outcomes{got: map[string][]error{}}
	const wait = 30 * time.Second // the pull's own timeout

	// The pull first, then its start.
	g.await("e1", "t1", "s1", wait, o.fn("pull before start"))
	o.none(t, "pull before start")
	g.begin("e1", "t1", "s1")
	fc.Advance(time.Millisecond)
	o.none(t, "pull before start")
	g.end("e1", "t1", "s1", nil)
	o.want(t, "pull before start", 0)

	// The start answered first: the pull reads at once.
	g.await("e1", "t1", "s1", wait, o.fn("pull after start"))
	o.want(t, "pull after start", 0)

	// The next leg of the same request on the same engine (a takeover,
	// start s2): the first leg's outcome does not decide its pull.
	g.await("e1", "t1", "s2", wait, o.fn("next leg's pull"))
	o.none(t, "next leg's pull")
	g.begin("e1", "t1", "s2")
	g.end("e1", "t1", "s2", api.Errorf(api.CodeFenced, "stale epoch"))
	o.want(t, "next leg's pull", api.CodeFenced)

	// Another engine's start of the same transfer and id settles nothing
	// of e2's pull.
	g.await("e2", "t1", "s3", wait, o.fn("e2's pull"))
	g.begin("e3", "t1", "s3")
	g.end("e3", "t1", "s3", nil)
	o.none(t, "e2's pull")
	// No start of e2's within startWait: the pull fails, and a start
	// that comes after does not tell it again.
	fc.Advance(startWait)
	o.want(t, "e2's pull", api.CodeTimeout)
	g.begin("e2", "t1", "s3")
	g.end("e2", "t1", "s3", nil)
	o.want(t, "e2's pull", api.CodeTimeout)

	// A start in flight (a slow store) is waited for past startWait, up
	// to the pull's deadline.
	g.begin("e1", "t4", "s4")
	g.await("e1", "t4", "s4", wait, o.fn("pull of a slow start"))
	g.await("e1", "t4", "s4", 8*time.Second, o.fn("pull with a short deadline"))
	fc.Advance(startWait + time.Second)
	o.none(t, "pull of a slow start")
	o.none(t, "pull with a short deadline")
	fc.Advance(2 * time.Second)
	o.want(t, "pull with a short deadline", api.CodeTimeout)
	g.end("e1", "t4", "s4", nil)
	o.want(t, "pull of a slow start", 0)

	// A failed start fails the pull with its code: the one its caller got,
	// for a domain error too.
	g.begin("e1", "t2", "s5")
	g.end("e1", "t2", "s5", api.Errorf(api.CodeOverloaded, "requests_max"))
	g.await("e1", "t2", "s5", wait, o.fn("pull of a refused start"))
	o.want(t, "pull of a refused start", api.CodeOverloaded)
	g.begin("e1", "t3", "s6")
	g.end("e1", "t3", "s6", fmt.Errorf("takeover: %w", requests.ErrInvalid))
	g.await("e1", "t3", "s6", wait, o.fn("pull of an invalid start"))
	o.want(t, "pull of an invalid start", api.CodeBadRequest)

	// Outcomes older than startKeep are forgotten (and their entries with
	// them): a pull then waits for a start of its own.
	fc.Advance(startKeep + time.Second)
	g.begin("e9", "t9", "s9")
	g.end("e9", "t9", "s9", nil)
	g.await("e1", "t2", "s5", wait, o.fn("pull after the outcome expired"))
	o.none(t, "pull after the outcome expired")
	g.mu.Lock()
	entries, ends := len(g.m), len(g.ended)
	g.mu.Unlock()
	if entries != 2 || ends != 1 {
		t.Fatalf("%d entries and %d recorded ends after the old ones expired, want 2 (e9's, e1's waiting pull) and 1", entries, ends)
	}

	// Stopping fails the waiting pull and any later one.
	g.close()
	o.want(t, "pull after the outcome expired", api.CodePeerUnavailable)
	g.await("e9", "t9", "s9", wait, o.fn("pull while stopping"))
	o.want(t, "pull while stopping", api.CodePeerUnavailable)
	fc.Advance(startWait)
	o.want(t, "pull after the outcome expired", api.CodePeerUnavailable)
}

// TestPullAwaitsItsStart: pull.start with await_start, sent before its
// request.start, is answered at once but reads only when the start is
// answered; a pull whose start is refused is refused with the start's
// code; a pull without await_start reads at once, as before.
func TestPullAwaitsItsStart(t *testing.T) {
	pa, regs, ps := newTestPullAPI()
	ra, _, _ := newTestRequestAPI()
	ra.max = 3
	gate := newStartGate(pa.clock)
	pa.starts, ra.starts = gate, gate
	regs.put(t, "d1", "r", testLayout(), "test")
	ctx := context.Background()
	tid := heldBy("p1").TransferId

	early := pullOf(tid, "p1", 2, 3)
	early.AwaitStart = "leg-1"
	if rep, err := pa.StartPull(ctx, early); err != nil || rep.PullId != "p1" {
		t.Fatalf("pull.start with await_start: %v, %v", rep, err)
	}
	if len(ps.started) != 0 {
		t.Fatal("the pull started before its request.start was answered")
	}
	// A start without the pull's id (another leg's, an older connector's)
	// does not open it.
	if _, err := ra.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "r0", EngineId: "d1", Params: heldBy("p1"), StartId: "leg-0"}); err != nil {
		t.Fatal(err)
	}
	if len(ps.started) != 0 {
		t.Fatal("another start opened the pull")
	}
	pa.clock.(*clock.Fake).Advance(time.Second)
	if _, err := ra.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "r1", EngineId: "d1", Params: heldBy("p1"), StartId: "leg-1"}); err != nil {
		t.Fatal(err)
	}
	if len(ps.started) != 1 || ps.started[0].ID != "p1" {
		t.Fatalf("pulls started once the start was answered: %d, want p1", len(ps.started))
	}
	// Its timeout counts from its pull.start: the second it waited is off.
	if p := ps.started[0]; p.Timeout != 29*time.Second || p.Stall != 10*time.Second {
		t.Fatalf("the pull's timeout %s, stall %s after a 1 s wait; want 29s and 10s", p.Timeout, p.Stall)
	}

	// r2's start fills requests_max (3, with r0 and r1); r3's is refused,
	// and so is the pull sent beside it.
	if _, err := ra.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "r2", EngineId: "d1", Params: heldBy("p1")}); err != nil {
		t.Fatal(err)
	}
	other := heldBy("p1")
	other.TransferId = tid2
	refused := pullOf(tid2, "p2", 4, 5)
	refused.AwaitStart = "leg-3"
	if _, err := pa.StartPull(ctx, refused); err != nil {
		t.Fatal(err)
	}
	_, err := ra.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "r3", EngineId: "d1", Params: other, StartId: "leg-3"})
	wantCode(t, "a third request over requests_max", err, api.CodeOverloaded)
	if len(ps.refused) != 1 || ps.refused[0].p.ID != "p2" || api.CodeOf(ps.refused[0].err) != api.CodeOverloaded {
		t.Fatalf("refused pulls %v: want p2, 429", ps.refused)
	}
	if len(ps.started) != 1 {
		t.Fatalf("%d pulls started, want only p1", len(ps.started))
	}

	// Without await_start: at once.
	if _, err := pa.StartPull(ctx, pullOf(tid2, "p3", 6, 7)); err != nil || len(ps.started) != 2 {
		t.Fatalf("pull without await_start: %v, %d started; want it started at once", err, len(ps.started))
	}
}

// TestStartGateBoundsEachEngine: an engine that sends starts with ids no
// pull follows keeps at most maxKeptPerEngine outcomes on the member; past
// them its outcomes still reach pulls already waiting, and other engines'
// are kept as before.
func TestStartGateBoundsEachEngine(t *testing.T) {
	fc := clock.NewFake(time.Unix(1000, 0))
	g := newStartGate(fc)
	o := &outcomes{got: map[string][]error{}}
	for i := range maxKeptPerEngine + 100 {
		id := fmt.Sprint("s", i)
		g.begin("spam", "t1", id)
		g.end("spam", "t1", id, nil)
	}
	g.await("spam", "t1", "waiting", time.Minute, o.fn("spam's waiting pull"))
	g.begin("spam", "t1", "waiting")
	g.end("spam", "t1", "waiting", nil)
	o.want(t, "spam's waiting pull", 0)
	g.begin("e1", "t1", "s1")
	g.end("e1", "t1", "s1", nil)
	g.await("e1", "t1", "s1", time.Minute, o.fn("e1's pull"))
	o.want(t, "e1's pull", 0)
	g.mu.Lock()
	entries, spam := len(g.m), g.kept["spam"]
	g.mu.Unlock()
	if spam != maxKeptPerEngine || entries != maxKeptPerEngine+1 {
		t.Fatalf("%d outcomes kept for the engine past its bound (%d entries in all), want %d (+1 for e1)", spam, entries, maxKeptPerEngine)
	}
	// They go with time, and the count with them.
	fc.Advance(startKeep + time.Second)
	g.begin("e1", "t2", "s2")
	g.end("e1", "t2", "s2", nil)
	g.mu.Lock()
	entries, spam = len(g.m), g.kept["spam"]
	g.mu.Unlock()
	if spam != 0 || entries != 1 {
		t.Fatalf("after startKeep: %d kept for the engine, %d entries; want 0 and 1", spam, entries)
	}
}
