package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// TestGrantMovesRequestAhead: the router's grant (peer.grant) moves a
// running request to the granted engine's member before the engine sends
// anything — the stored state names that engine at the next epoch and the
// hold is bound to it — and the engine's takeover then confirms it at the
// same epoch with the tokens it was resent; its pull, progress and finish
// work, and the hold is released once. A grant of a request that is not
// stored moves nothing, and the engine's takeover then creates it.
func TestGrantMovesRequestAhead(t *testing.T) {
	c := newDecodeCluster(t, "d1", "d2")
	d1, d2 := c.engines["d1"], c.engines["d2"]
	src := []uint32{2, 3, 4, 5}
	prm := c.requestHold(t, "r-ahead", d1, src)
	freed := subscribe(t, c.nc, api.FreedSubject(c.prefill.cli.Member, c.prefill.id), func() *messages.BlocksFreed { return new(messages.BlocksFreed) })
	c.startRequest(t, "d1", "r-ahead", prm, prompt(64))
	if err := c.progress(t, "d1", "r-ahead", 1, 7, 8, 9); err != nil {
		t.Fatal(err)
	}

	member := &api.Client{NC: c.nc, Member: d2.cli.Member} // the router's scope: members only
	if _, err := member.GrantTakeover(ctx5(t), &messages.StartRequestMsg{RequestId: "r-ahead", EngineId: d2.id, Takeover: true}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		st, err := member.InspectRequest(ctx5(t), &messages.RequestRef{RequestId: "r-ahead"})
		if err != nil {
			return err
		}
		if s := st.GetState(); s.GetEpoch() != 2 || s.GetEngineId() != d2.id || s.GetOwner() != d2.cli.Member || len(s.GetGeneratedTokenIds()) != 3 {
			return fmt.Errorf("request after the grant: %v, want it on %s's engine %s at epoch 2 with its 3 tokens", s, d2.cli.Member, d2.id)
		}
		return nil
	})
	// The hold followed: the old engine may no longer renew it.
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		_, err := c.prefill.cli.Renew(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId, Requester: d1.id, RequestId: "r-ahead"})
		if api.CodeOf(err) != api.CodeNotYours {
			return fmt.Errorf("renew by the old engine after the grant: %v, want not_yours", err)
		}
		return nil
	})

	// The engine's takeover, with the two tokens more the router had seen:
	// answered at the grant's epoch, the tokens kept.
	resent := append(prompt(64), 7, 8, 9, 10, 11)
	st, err := d2.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-ahead", Params: prm, PromptTokenIds: resent, EngineId: d2.id, Takeover: true, ResumeAuthority: "router"})
	if err != nil || st.State.GetEpoch() != 2 || st.State.GetEngineId() != d2.id || len(st.State.GetGeneratedTokenIds()) != 5 {
		t.Fatalf("the granted engine's takeover: %v %v, want epoch 2 on %s with 5 generated tokens", st, err, d2.id)
	}
	done := subscribe(t, c.nc, api.PullDoneSubject(d2.cli.Member, d2.id), func() *messages.PullDone { return new(messages.PullDone) })
	dst := []uint32{6, 7, 8, 9}
	if _, err := d2.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: prm, EngineId: d2.id, RegionId: d2.rid, BlockIds: dst, PullId: "ahead"}); err != nil {
		t.Fatal(err)
	}
	if d := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == "ahead" }); !d.Ok {
		t.Fatalf("the granted engine's pull: %v", d)
	}
	verifyBlocks(t, c.prefill.region, d2.region, src, dst, nil)
	if err := c.progress(t, "d2", "r-ahead", 2, 12); err != nil {
		t.Fatalf("progress at the grant's epoch: %v", err)
	}
	if err := c.progress(t, "d1", "r-ahead", 1, 99); api.CodeOf(err) == 0 {
		t.Fatal("the old engine's progress at epoch 1 was accepted after the grant")
	}
	got, err := member.InspectRequest(ctx5(t), &messages.RequestRef{RequestId: "r-ahead"})
	if err != nil || len(got.GetState().GetGeneratedTokenIds()) != 6 {
		t.Fatalf("request after the confirmation and a progress: %v %v, want 6 generated tokens", got, err)
	}
	m, err := scrape(c.procs["d2"].metricsURL)
	if err != nil || m["connex_request_grants_moved_total"] != 1 || m["connex_requests_taken_over_total"] != 1 {
		t.Fatalf("d2's metrics: grants moved %v, taken over %v (%v), want 1 and 1", m["connex_request_grants_moved_total"], m["connex_requests_taken_over_total"], err)
	}
	if _, err := d2.cli.FinishRequest(ctx5(t), &messages.FinishRequestMsg{RequestId: "r-ahead", Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	if f := freed.wait(t, 5*time.Second, func(m *messages.BlocksFreed) bool { return m.TransferId == prm.TransferId }); f.Reason != "released" {
		t.Fatalf("blocks freed as %q, want released", f.Reason)
	}

	// Nothing stored under the id: the grant moves nothing; the engine's
	// takeover creates the request.
	other := proto.CloneOf(c.hold(t, []uint32{6, 7}, 32))
	other.ConnexRequestId = "r-new"
	if _, err := member.GrantTakeover(ctx5(t), &messages.StartRequestMsg{RequestId: "r-new", EngineId: d2.id, Takeover: true}); err != nil {
		t.Fatal(err)
	}
	created, err := d2.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-new", Params: other, PromptTokenIds: prompt(32), EngineId: d2.id, Takeover: true, ResumeAuthority: "router"})
	if err != nil || created.State.GetEpoch() != 1 || created.State.GetEngineId() != d2.id {
		t.Fatalf("takeover of a request that was not stored: %v %v, want it created at epoch 1", created, err)
	}
	if _, err := d2.cli.FinishRequest(ctx5(t), &messages.FinishRequestMsg{RequestId: "r-new", Epoch: 1}); err != nil {
		t.Fatal(err)
	}
}
