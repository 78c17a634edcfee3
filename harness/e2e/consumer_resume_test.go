package e2e

import (
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// TestResumePullsConsumerBoundHold: a hold bound to one decode engine
// (consumer) is pulled by the engine a resume moves its request to, once
// the request's durable state names that engine at a newer epoch; an
// engine that only claims the request is refused before and after, the
// old consumer loses the hold, and the new one's finish releases it.
func TestResumePullsConsumerBoundHold(t *testing.T) {
	c := newDecodeCluster(t, "d1", "d2", "d3")
	src := []uint32{2, 3, 4, 5}
	d1, d2, d3 := c.engines["d1"], c.engines["d2"], c.engines["d3"]
	prm := c.requestHold(t, "r-bound", d1, src)
	freed := subscribe(t, c.nc, api.FreedSubject(c.prefill.cli.Member, c.prefill.id), func() *messages.BlocksFreed { return new(messages.BlocksFreed) })
	pull := func(e *engine, id string, dst []uint32) *messages.PullDone {
		t.Helper()
		done := subscribe(t, c.nc, api.PullDoneSubject(e.cli.Member, e.id), func() *messages.PullDone { return new(messages.PullDone) })
		if _, err := e.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: prm, EngineId: e.id, RegionId: e.rid, BlockIds: dst, PullId: id}); err != nil {
			t.Fatalf("pull.start %s by %s: %v", id, e.id, err)
		}
		return done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == id })
	}
	refused := func(d *messages.PullDone, who string) {
		t.Helper()
		if d.Ok || api.Code(d.ErrorCode) != api.CodeNotYours {
			t.Fatalf("pull by %s: %v, want refused with %d (not_yours)", who, d, api.CodeNotYours)
		}
	}

	c.startRequest(t, "d1", "r-bound", prm, prompt(64))
	if d := pull(d1, "first", []uint32{1, 2, 3, 4}); !d.Ok {
		t.Fatalf("the consumer's own pull: %v", d)
	}
	// d2 names the request but does not run it: refused.
	refused(pull(d2, "claim", []uint32{1, 2, 3, 4}), "an engine that only claims the request")

	// The router resumes the request on d2: request.start with takeover
	// moves it there at epoch 2, and d2's pull of the bound hold succeeds.
	st, err := d2.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-bound", Params: prm, PromptTokenIds: prompt(64), EngineId: d2.id, Takeover: true, ResumeAuthority: "router"})
	if err != nil || st.State.Epoch != 2 || st.State.EngineId != d2.id {
		t.Fatalf("takeover on d2: %v %v", st, err)
	}
	dst := []uint32{6, 7, 8, 9}
	if d := pull(d2, "resumed", dst); !d.Ok {
		t.Fatalf("the resumed engine's pull of the consumer-bound hold: %v", d)
	}
	verifyBlocks(t, c.prefill.region, d2.region, src, dst, nil)
	if m, err := scrape(c.procs["d2"].metricsURL); err != nil || m["connex_requests_taken_over_total"] != 1 || m[`connex_pulls_total{outcome="ok"}`] != 1 {
		t.Fatalf("d2's metrics after the takeover and its pull: taken over %v, ok pulls %v (%v)", m["connex_requests_taken_over_total"], m[`connex_pulls_total{outcome="ok"}`], err)
	}
	// The hold now belongs to d2: neither the old consumer nor a third
	// engine naming the request may pull or renew it.
	refused(pull(d3, "third", []uint32{1, 2, 3, 4}), "a third engine")
	if _, err := c.prefill.cli.Renew(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId, Requester: d1.id, RequestId: "r-bound"}); api.CodeOf(err) != api.CodeNotYours {
		t.Fatalf("renew by the old consumer after the resume: %v, want not_yours", err)
	}
	if len(freed.all()) != 0 {
		t.Fatalf("blocks freed before the request finished: %v", freed.all())
	}
	// d2 finishes: its connexd releases the hold as d2, which it may now.
	if _, err := d2.cli.FinishRequest(ctx5(t), &messages.FinishRequestMsg{RequestId: "r-bound", Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	f := freed.wait(t, 5*time.Second, func(m *messages.BlocksFreed) bool { return m.TransferId == prm.TransferId })
	if f.Reason != "released" {
		t.Fatalf("blocks freed as %q, want released", f.Reason)
	}
}
