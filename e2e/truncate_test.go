package e2e

import (
	"os"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// TestTruncatedRegionFailsThePullNotConnexd: a prefill engine truncates its
// registered region file while a hold of it is pulled over the TCP data
// plane. The pull fails with a clear error; both connexd live and keep
// serving. (With UCX, a copy from a truncated file still faults the
// process: ARCHITECTURE.md's threat model lists it.)
func TestTruncatedRegionFailsThePullNotConnexd(t *testing.T) {
	pre, dec, pn, dn := cluster2(t, "tcp")
	h, err := pre.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pre.id, RegionId: pre.rid, BlockIds: []uint32{20, 21, 22, 23}, NumTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	// The engine's file now ends before the held blocks.
	if err := os.Truncate(pre.region.Path, 4096); err != nil {
		t.Fatal(err)
	}
	done := subscribe(t, dec.cli.NC, api.PullDoneSubject(dec.id), func() *messages.PullDone { return new(messages.PullDone) })
	if _, err := dec.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: h.Params, EngineId: dec.id, RegionId: dec.rid, BlockIds: []uint32{1, 2, 3, 4}, PullId: "trunc"}); err != nil {
		t.Fatal(err)
	}
	d := done.wait(t, 20*time.Second, func(m *messages.PullDone) bool { return m.PullId == "trunc" })
	if d.Ok {
		t.Fatalf("a pull from a truncated region succeeded: %v", d)
	}
	t.Logf("pull from a truncated region: %s (%d)", d.Error, d.ErrorCode)
	for _, p := range []*proc{pn, dn} {
		if !p.running() {
			t.Fatalf("connexd %s died:\n%s", p.member, p.logs())
		}
	}
	if _, err := pre.cli.Inspect(ctx5(t), &messages.HoldRef{TransferId: h.Params.TransferId}); err != nil {
		t.Fatalf("the holder after the failed pull: %v", err)
	}
}
