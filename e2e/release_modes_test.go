package e2e

import (
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// TestAfterPullFreesAfterFirstPull: release=after_pull behaves like other
// connectors — the first successful pull frees the blocks (reason
// "pulled"), and a second pull is refused.
func TestAfterPullFreesAfterFirstPull(t *testing.T) {
	pe, de, _, _ := cluster2(t, "tcp")
	nc := pe.cli.NC
	freed := subscribe(t, nc, api.FreedSubject(pe.id), func() *messages.BlocksFreed { return new(messages.BlocksFreed) })
	done := subscribe(t, nc, api.PullDoneSubject(de.id), func() *messages.PullDone { return new(messages.PullDone) })
	src := []uint32{7, 8}
	hold, err := pe.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pe.id, RegionId: pe.rid, BlockIds: src, Release: "after_pull"})
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"once", "twice"} {
		if _, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: hold.Params, EngineId: de.id, RegionId: de.rid, BlockIds: []uint32{uint32(2 * i), uint32(2*i + 1)}, PullId: id}); err != nil {
			t.Fatal(err)
		}
		d := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == id })
		if i == 0 && !d.Ok {
			t.Fatalf("first pull: %v", d)
		}
		if i == 1 && (d.Ok || d.ErrorCode != uint32(api.CodeReleased)) {
			t.Fatalf("second pull after an after_pull hold was consumed: %v", d)
		}
	}
	verifyBlocks(t, pe.region, de.region, src, []uint32{0, 1}, nil)
	f := freed.wait(t, 5*time.Second, func(m *messages.BlocksFreed) bool { return m.TransferId == hold.Params.TransferId })
	if f.Reason != "pulled" {
		t.Fatalf("reason %q", f.Reason)
	}
	if _, err := pe.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pe.id, RegionId: pe.rid, BlockIds: src, Release: "sometimes"}); api.CodeOf(err) != api.CodeBadRequest {
		t.Fatalf("bad release mode: %v", err)
	}
}

// TestEngineGoneEndsHolds: when the prefill engine goes away its holds end
// without a freed notice, its region is forgotten, and pulls of its
// transfers get the engine_gone code.
func TestEngineGoneEndsHolds(t *testing.T) {
	pe, de, _, _ := cluster2(t, "tcp")
	nc := pe.cli.NC
	freed := subscribe(t, nc, api.FreedSubject(pe.id), func() *messages.BlocksFreed { return new(messages.BlocksFreed) })
	done := subscribe(t, nc, api.PullDoneSubject(de.id), func() *messages.PullDone { return new(messages.PullDone) })
	hold, err := pe.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pe.id, RegionId: pe.rid, BlockIds: []uint32{1}})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := pe.cli.EngineGone(ctx5(t), &messages.EngineGoneRequest{EngineId: pe.id})
	if err != nil || rep.HoldsDropped != 1 || rep.RegionsDropped != 1 {
		t.Fatalf("engine gone: %v %v", rep, err)
	}
	if _, err := pe.cli.InspectRegion(ctx5(t), &messages.RegionRef{EngineId: pe.id, RegionId: pe.rid}); api.CodeOf(err) != api.CodeUnknownRegion {
		t.Fatalf("region after engine gone: %v", err)
	}
	if _, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: hold.Params, EngineId: de.id, RegionId: de.rid, BlockIds: []uint32{3}, PullId: "gone"}); err != nil {
		t.Fatal(err)
	}
	d := done.wait(t, 5*time.Second, func(m *messages.PullDone) bool { return m.PullId == "gone" })
	if d.Ok || d.ErrorCode != uint32(api.CodeEngineGone) {
		t.Fatalf("pull after engine gone: %v", d)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := len(freed.all()); n != 0 {
		t.Fatalf("%d freed notices to an engine that is gone", n)
	}
}
