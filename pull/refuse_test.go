package pull

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
)

// TestRefuseGivesBackAndTells: a pull refused before it reads (its
// request's start failed) gives its destination blocks and region back
// before the engine hears of it, and its PullDone carries the error's code.
func TestRefuseGivesBackAndTells(t *testing.T) {
	l := kvmem.Layout{Layers: 1, Planes: 2, Blocks: 4, BlockBytes: 16, BlockSize: 4, TPSize: 1}
	dst := mapped(t, l)
	if err := dst.Blocks.BeginWrite([]uint32{1, 2}); err != nil {
		t.Fatal(err)
	}
	released := 0
	var done *messages.PullDone
	var bg sync.WaitGroup
	deps := &PullDeps{Log: slog.New(slog.DiscardHandler), Metrics: &actors.Metrics{}, LoadFailurePolicy: "recompute",
		Go: func(f func()) { bg.Add(1); go func() { defer bg.Done(); f() }() },
		Notify: func(d *messages.PullDone) {
			// The engine may pull into the same blocks as soon as it reads this.
			if err := dst.Blocks.BeginWrite([]uint32{1, 2}); err != nil {
				t.Errorf("blocks still claimed when PullDone went out: %v", err)
			}
			if released != 1 {
				t.Errorf("region released %d times when PullDone went out, want 1", released)
			}
			done = d
		}}
	params := &messages.KVTransferParams{TransferId: strings.Repeat("ab", 16), ConnexRequestId: "r1"}
	Refuse(deps, &Pull{ID: "p1", Params: params, Dst: dst, DstBlocks: []uint32{1, 2}, Timeout: time.Minute, ReleaseRegion: func() { released++ }},
		api.Errorf(api.CodeOverloaded, "its request.start failed: over requests_max"))
	bg.Wait() // on the daemon's background group, which its Close waits for
	if done == nil || done.Ok || done.ErrorCode != uint32(api.CodeOverloaded) || !strings.Contains(done.Error, "requests_max") ||
		done.PullId != "p1" || done.RequestId != "r1" || done.KvLoadFailurePolicy != "recompute" {
		t.Fatalf("PullDone %v: want p1 of r1 failed 429 naming requests_max, policy recompute", done)
	}
	// Started and failed: a daemon's "work in hand" (started > ok + failed)
	// does not drift.
	if s, f := deps.Metrics.PullsStarted.Load(), deps.Metrics.PullsFailed.Load(); s != 1 || f != 1 {
		t.Fatalf("pulls_started %d, pulls_failed %d; want 1 and 1", s, f)
	}
}
