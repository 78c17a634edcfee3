package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/config"
	"github.com/connex/connex/lease"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests/activation"
)

const (
	tid1 = "0123456789abcdef0123456789abcdef"
	tid2 = "fedcba9876543210fedcba9876543210"
)

func newTestHoldAPI() (*holdAPI, *fakeHoldDir, *fakeHoldActors, *fakeRegions) {
	dir, acts, regs := newFakeHoldDir(), &fakeHoldActors{}, newFakeRegions()
	cfg := config.Config{MemberID: "m1", Release: "on_finish", Retain: time.Minute, HoldsMaxPerEngine: 2, PullTimeout: 30 * time.Second}
	return &holdAPI{cfg: cfg, dir: dir, actors: acts, regions: regs, log: quiet}, dir, acts, regs
}

func TestReleaseAnswersWhyAHoldIsNotThere(t *testing.T) {
	h, dir, acts, _ := newTestHoldAPI()
	ctx := context.Background()
	_, err := h.Release(ctx, &messages.HoldRef{TransferId: "not-hex"})
	wantCode(t, "release of a malformed transfer id", err, api.CodeBadRequest)
	_, err = h.Release(ctx, &messages.HoldRef{TransferId: tid1})
	wantCode(t, "release of an unknown transfer", err, api.CodeUnknownTransfer)
	for st, want := range map[lease.State]api.Code{
		lease.Expired: api.CodeExpired, lease.Unclaimed: api.CodeExpired, lease.EngineGone: api.CodeEngineGone,
		lease.Released: api.CodeReleased, lease.ShutDown: api.CodeReleased,
	} {
		dir.end(tid2, st)
		_, err = h.Release(ctx, &messages.HoldRef{TransferId: tid2})
		wantCode(t, "release of a hold ended "+st.String(), err, want)
	}
	if n := len(acts.messages()); n != 0 {
		t.Fatalf("%d messages sent to hold actors for holds that are not live", n)
	}
	// A live hold gets the release, by whom it says.
	dir.hold(tid1, "e")
	if _, err := h.Release(ctx, &messages.HoldRef{TransferId: tid1, Requester: "d1"}); err != nil {
		t.Fatal(err)
	}
	got := acts.messages()
	if rel, ok := got[0].msg.(*actors.ReleaseHold); len(got) != 1 || got[0].to != tid1 || !ok || rel.By != "d1" {
		t.Fatalf("hold actors got %+v, want one ReleaseHold by d1 to %s", got, tid1)
	}
}

func TestAskHoldLooksAgainWhenTheHoldEndedMeanwhile(t *testing.T) {
	h, dir, acts, _ := newTestHoldAPI()
	dir.hold(tid1, "e")
	// The hold stops between the lookup and the ask: its directory entry
	// then says why.
	acts.answer = func(string, any) (actors.Reply, error) {
		dir.end(tid1, lease.Expired)
		return actors.Reply{}, actor.ErrDeadLetter
	}
	_, err := h.Renew(context.Background(), &messages.HoldRef{TransferId: tid1})
	wantCode(t, "renew of a hold that expired during the ask", err, api.CodeExpired)
}

func TestCreateHoldRefusals(t *testing.T) {
	h, dir, acts, regs := newTestHoldAPI()
	ctx := context.Background()
	_, err := h.CreateHold(ctx, &messages.CreateHoldRequest{EngineId: "e", RegionId: "r", Release: "sometimes"})
	wantCode(t, "create with an unknown release mode", err, api.CodeBadRequest)
	_, err = h.CreateHold(ctx, &messages.CreateHoldRequest{EngineId: "e", RegionId: "r", RetainS: 86401})
	wantCode(t, "create with retain_s over a day", err, api.CodeBadRequest)
	_, err = h.CreateHold(ctx, &messages.CreateHoldRequest{EngineId: "e", RegionId: "nope"})
	wantCode(t, "create on an unknown region", err, api.CodeUnknownRegion)
	regs.put(t, "e", "r", testLayout(), "test")
	_, err = h.CreateHold(ctx, &messages.CreateHoldRequest{EngineId: "e", RegionId: "r", BlockIds: []uint32{99}})
	if err == nil {
		t.Fatal("create with a block id beyond the region: no error")
	}
	if regs.acquired != regs.released {
		t.Fatalf("refused creates acquired %d regions and released %d", regs.acquired, regs.released)
	}
	dir.hold(tid1, "e")
	dir.hold(tid2, "e")
	_, err = h.CreateHold(ctx, &messages.CreateHoldRequest{EngineId: "e", RegionId: "r", BlockIds: []uint32{1}})
	wantCode(t, "create over holds_max_per_engine", err, api.CodeOverloaded)
	if n := len(acts.messages()); n != 0 {
		t.Fatalf("%d messages sent to the hold supervisor for refused creates", n)
	}
	// Within bounds: the table is asked, with the lease the call asked for.
	delete(dir.live, tid2)
	acts.answer = func(string, any) (actors.Reply, error) {
		return actors.Reply{Create: &messages.CreateHoldReply{}}, nil
	}
	if _, err := h.CreateHold(ctx, &messages.CreateHoldRequest{EngineId: "e", RegionId: "r", BlockIds: []uint32{1}, RetainS: 7}); err != nil {
		t.Fatal(err)
	}
	c, ok := acts.messages()[0].msg.(*actors.CreateHold)
	if !ok || c.Lease.Retain != 7*time.Second || c.Lease.Owner != "e" || len(c.ID) != 32 {
		t.Fatalf("hold supervisor got %+v, want a CreateHold owned by e retained 7s", acts.messages()[0].msg)
	}
}

func TestInspectOfAnEndedHoldReportsItsEnd(t *testing.T) {
	h, dir, _, _ := newTestHoldAPI()
	dir.end(tid1, lease.Expired)
	st, err := h.Inspect(context.Background(), &messages.HoldRef{TransferId: tid1})
	if err != nil || st.State != lease.Expired.String() || !st.Freed {
		t.Fatalf("inspect of an expired hold: %v, %v; want its final state, freed", st, err)
	}
}

// fakeBinder is holdBinder: it records the calls it was asked to bind.
type fakeBinder struct{ calls chan activation.BindCall }

func (b *fakeBinder) bind(c activation.BindCall) { b.calls <- c }

func TestDescriptorsRefusedAsUnboundIsBoundThenAsked(t *testing.T) {
	h, dir, acts, _ := newTestHoldAPI()
	b := &fakeBinder{calls: make(chan activation.BindCall, 4)}
	h.binder = b
	dir.hold(tid1, "p")
	// The fast path names the request; the hold is not bound to it yet.
	acts.answer = func(_ string, msg any) (actors.Reply, error) {
		if r := msg.(*actors.StartRead); r.Request != "" {
			return actors.Reply{Unbound: true}, nil
		}
		return actors.Reply{Desc: &messages.Descriptors{}}, nil
	}
	type answer struct {
		d   *messages.Descriptors
		err error
	}
	got := make(chan answer, 1)
	h.Descriptors(context.Background(), &messages.DescriptorsRequest{TransferId: tid1, PullId: "p1", Requester: "d1", RequestId: "req1",
		Layout: actors.LayoutToProto(testLayout())}, func(d *messages.Descriptors, err error) { got <- answer{d, err} })
	var a answer
	select {
	case a = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no answer to peer.descriptors")
	}
	if a.err != nil || a.d == nil {
		t.Fatalf("answer %v, %v; want the descriptors", a.d, a.err)
	}
	select {
	case c := <-b.calls:
		if c != (activation.BindCall{Transfer: tid1, Requester: "d1", Request: "req1"}) {
			t.Fatalf("bound %+v", c)
		}
	default:
		t.Fatal("a read refused as unbound was answered without binding the hold first")
	}
	msgs := acts.messages()
	if len(msgs) != 2 || msgs[1].msg.(*actors.StartRead).Request != "" {
		t.Fatalf("hold got %d messages (%+v); want the fast read, then the plain read after the bind", len(msgs), msgs)
	}
}

func TestDescriptorsRefusesBadCallsAtOnce(t *testing.T) {
	h, _, acts, _ := newTestHoldAPI()
	var err error
	answer := func(_ *messages.Descriptors, e error) { err = e }
	h.Descriptors(context.Background(), &messages.DescriptorsRequest{TransferId: tid1, PullId: "", Layout: actors.LayoutToProto(testLayout())}, answer)
	wantCode(t, "descriptors without a pull id", err, api.CodeBadRequest)
	h.Descriptors(context.Background(), &messages.DescriptorsRequest{TransferId: tid1, PullId: "p", Layout: actors.LayoutToProto(testLayout()), TimeoutMs: uint32(2 * maxPullTimeout / time.Millisecond)}, answer)
	wantCode(t, "descriptors with a timeout over an hour", err, api.CodeBadRequest)
	h.Descriptors(context.Background(), &messages.DescriptorsRequest{TransferId: tid1, PullId: "p", Layout: actors.LayoutToProto(testLayout())}, answer)
	wantCode(t, "descriptors of an unknown transfer", err, api.CodeUnknownTransfer)
	if !strings.Contains(err.Error(), "m1") || len(acts.messages()) != 0 {
		t.Fatalf("err %v, %d messages; want the member named and nothing sent", err, len(acts.messages()))
	}
}

func TestDropEngineEndsOnlyItsHolds(t *testing.T) {
	h, dir, acts, _ := newTestHoldAPI()
	dir.hold(tid1, "e")
	dir.hold(tid2, "other")
	if n := h.dropEngine("e"); n != 1 {
		t.Fatalf("dropped %d holds, want 1", n)
	}
	got := acts.messages()
	if _, ok := got[0].msg.(*actors.EngineGone); len(got) != 1 || got[0].to != tid1 || !ok {
		t.Fatalf("hold actors got %+v, want EngineGone to %s only", got, tid1)
	}
}
