package e2e

import (
	"reflect"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// TestPeerCallsCannotBeAbused: what a hostile client on the same NATS
// could do through the member-to-member endpoints, refused: ending
// another reader's pull (peer.pullend names its reader), pinning a
// released hold's blocks for an hour (a reader's deadline is capped by the
// hold's lease), and fencing a live request by adopting it (peer.adopt is
// refused while the owner is live in the adopting member's view).
func TestPeerCallsCannotBeAbused(t *testing.T) {
	c := newDecodeCluster(t, "d1", "d2")
	peer := c.prefill.cli // connex.v1.prefill.* as any client can call it
	h, err := peer.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: c.prefill.id, RegionId: c.prefill.rid, BlockIds: []uint32{1, 2}, NumTokens: 32, RetainS: 2})
	if err != nil {
		t.Fatal(err)
	}
	tid := h.Params.TransferId
	freed := subscribe(t, c.nc, api.FreedSubject(c.prefill.cli.Member, c.prefill.id), func() *messages.BlocksFreed { return new(messages.BlocksFreed) })
	layout := &messages.Layout{NumLayers: testLayout.Layers, KvPlanes: testLayout.Planes, NumBlocks: testLayout.Blocks, BlockBytes: testLayout.BlockBytes, BlockSize: testLayout.BlockSize, TpSize: testLayout.TPSize}
	if _, err := peer.Descriptors(ctx5(t), &messages.DescriptorsRequest{TransferId: tid, Requester: "engA", PullId: "pa", Layout: layout, TimeoutMs: 3_600_000}); err != nil {
		t.Fatal(err)
	}
	if _, err := peer.PullEnd(ctx5(t), &messages.PullEnd{TransferId: tid, Requester: "engB", PullId: "pa", Ok: true}); api.CodeOf(err) != api.CodeNotYours {
		t.Fatalf("another reader's peer.pullend: %v, want not_yours", err)
	}
	st, err := peer.Inspect(ctx5(t), &messages.HoldRef{TransferId: tid})
	if err != nil || st.ActivePulls != 1 {
		t.Fatalf("the pull after a spoofed end: %v %v, want still running", st, err)
	}
	// The owner releases while "engA" never ends its hour-long pull: the
	// blocks come back one lease (2 s) plus the read slack after the pull
	// began, not in an hour.
	released := time.Now()
	if _, err := peer.Release(ctx5(t), &messages.HoldRef{TransferId: tid, Requester: c.prefill.id}); err != nil {
		t.Fatal(err)
	}
	f := freed.wait(t, 15*time.Second, func(m *messages.BlocksFreed) bool { return m.TransferId == tid })
	t.Logf("release with a 1 h reader pending -> blocks freed (%s) in %s", f.Reason, time.Since(released).Round(time.Millisecond))

	// A live request cannot be adopted away from its owner.
	prm := c.hold(t, []uint32{3, 4}, 32)
	c.startRequest(t, "d1", "r-live", prm, prompt(32))
	if _, err := c.engines["d2"].cli.Adopt(ctx5(t), &messages.AdoptRequestMsg{RequestId: "r-live", DeadOwner: "d1"}); api.CodeOf(err) != api.CodeBadRequest {
		t.Fatalf("adopting a live request: %v, want bad_request (owner live)", err)
	}
	cur, err := c.engines["d1"].cli.InspectRequest(ctx5(t), &messages.RequestRef{RequestId: "r-live"})
	if err != nil || cur.State.Owner != "d1" || cur.State.Epoch != 1 || !reflect.DeepEqual(cur.State.PromptTokenIds, prompt(32)) {
		t.Fatalf("the live request after the refused adoption: %v %v", cur, err)
	}
	if err := c.progress(t, "d1", "r-live", 1, 5); err != nil {
		t.Fatalf("the owner's progress after the refused adoption: %v", err)
	}
}
