package e2e

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// TestPullAwaitsItsTakeover: a resumed engine sends its pull.start with
// await_start before its takeover's request.start, as the vLLM connector
// does (both in one engine step). The hold is still bound to the engine
// the request ran on, so a pull that read at once would be refused
// (not_yours); connexd holds it until the takeover is answered, and it
// reads the hold's bytes. A pull whose request.start is refused is
// refused with the start's code, its destination blocks given back.
func TestPullAwaitsItsTakeover(t *testing.T) {
	c := newDecodeCluster(t, "d1", "d2")
	d1, d2 := c.engines["d1"], c.engines["d2"]
	src := []uint32{2, 3, 4, 5}
	prm := c.requestHold(t, "r-await", d1, src)
	c.startRequest(t, "d1", "r-await", prm, prompt(64))
	done := subscribe(t, c.nc, api.PullDoneSubject(d2.cli.Member, d2.id), func() *messages.PullDone { return new(messages.PullDone) })

	dst := []uint32{6, 7, 8, 9}
	if _, err := d2.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: prm, EngineId: d2.id, RegionId: d2.rid, BlockIds: dst, PullId: "early", AwaitStart: "leg-2"}); err != nil {
		t.Fatalf("pull.start with await_start before the takeover: %v", err)
	}
	st, err := d2.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-await", Params: prm, PromptTokenIds: prompt(64), EngineId: d2.id, Takeover: true, ResumeAuthority: "router", StartId: "leg-2"})
	if err != nil || st.State.Epoch != 2 {
		t.Fatalf("takeover on d2: %v %v", st, err)
	}
	if d := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == "early" }); !d.Ok {
		t.Fatalf("the pull sent before its takeover: %v, want read once the takeover was answered", d)
	}
	verifyBlocks(t, c.prefill.region, d2.region, src, dst, nil)

	// A start refused (here: a takeover naming another transfer than the
	// request's) refuses the pull sent beside it, with the start's code.
	other := proto.CloneOf(prm)
	other.TransferId = strings.Repeat("0", 32)
	if _, err := d1.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: other, EngineId: d1.id, RegionId: d1.rid, BlockIds: dst, PullId: "refused", AwaitStart: "leg-3"}); err != nil {
		t.Fatal(err)
	}
	d1done := subscribe(t, c.nc, api.PullDoneSubject(d1.cli.Member, d1.id), func() *messages.PullDone { return new(messages.PullDone) })
	_, err = d1.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-await", Params: other, PromptTokenIds: prompt(64), EngineId: d1.id, Takeover: true, ResumeAuthority: "router", StartId: "leg-3"})
	if err == nil {
		t.Fatal("a takeover naming another transfer was accepted")
	}
	d := d1done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == "refused" })
	if d.Ok || api.Code(d.ErrorCode) != api.CodeOf(err) || !strings.Contains(d.Error, "request.start failed") {
		t.Fatalf("the pull beside a refused start: %v, want refused with the start's code %d", d, api.CodeOf(err))
	}
	// Its blocks were given back: the same blocks take another pull.
	if _, err := d1.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: other, EngineId: d1.id, RegionId: d1.rid, BlockIds: dst, PullId: "again"}); err != nil {
		t.Fatalf("pull.start into the refused pull's blocks: %v", err)
	}
}
