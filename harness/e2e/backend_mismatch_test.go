package e2e

import (
	"testing"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// TestPullFromAnotherDataPlaneIsRefusedAtOnce: a hold on a member whose data
// plane differs from the reader's is refused by pull.start with
// incompatible (424), before any destination block is claimed, instead of a
// pull that fails later.
func TestPullFromAnotherDataPlaneIsRefusedAtOnce(t *testing.T) {
	p := startConnexd(t, "p1", "--role", "prefill")
	nc := connect(t, p.natsURL)
	prod := newEngine(t, nc, p.member, "prod", testLayout, true)
	hold, err := prod.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: prod.id, RegionId: prod.rid, BlockIds: []uint32{0, 1}, NumTokens: 32})
	if err != nil {
		t.Fatal(err)
	}
	cons := newEngine(t, nc, p.member, "cons", testLayout, false)
	params := hold.Params
	params.RemoteCtrl.Backend = "rdma-of-the-future"
	_, err = cons.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: params, EngineId: cons.id, RegionId: cons.rid, BlockIds: []uint32{3, 4}})
	if api.CodeOf(err) != api.CodeIncompatible {
		t.Fatalf("pull.start across data planes: %v, want incompatible (424)", err)
	}
	info, err := cons.cli.InspectRegion(ctx5(t), &messages.RegionRef{EngineId: cons.id, RegionId: cons.rid})
	if err != nil || info.BlocksWriting != 0 {
		t.Fatalf("destination blocks claimed by a refused pull: %v %v", info, err)
	}
}
