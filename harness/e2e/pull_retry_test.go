package e2e

import (
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// TestPullStartSentAgain: an engine whose pull.start answer was lost sends
// it again with the same pull id while the pull runs (here: its holder is
// frozen) and is told the pull runs, not refused; the same id for another
// transfer is refused with bad_request; the pull ends with one pull.done.
func TestPullStartSentAgain(t *testing.T) {
	url := startNATS(t)
	holder := startConnexd(t, "holder", "--backend", "tcp", "--nats-url", url, "--pull-stall-ms", "3000")
	startConnexd(t, "reader", "--backend", "tcp", "--nats-url", url)
	nc := connect(t, url)
	pe := newEngine(t, nc, "holder", "engP", testLayout, true)
	de := newEngine(t, nc, "reader", "engD", testLayout, false)
	hold := func(blocks ...uint32) *messages.KVTransferParams {
		h, err := pe.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pe.id, RegionId: pe.rid, BlockIds: blocks, NumTokens: 16 * uint32(len(blocks))})
		if err != nil {
			t.Fatal(err)
		}
		return h.Params
	}
	a, b := hold(1, 2), hold(3)
	done := subscribe(t, nc, api.PullDoneSubject(de.cli.Member, de.id), func() *messages.PullDone { return new(messages.PullDone) })
	holder.signal(syscall.SIGSTOP)
	start := func(prm *messages.KVTransferParams, dst ...uint32) error {
		_, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: prm, EngineId: de.id, RegionId: de.rid, BlockIds: dst, PullId: "again"})
		return err
	}
	if err := start(a, 5, 6); err != nil {
		t.Fatal(err)
	}
	if err := start(a, 5, 6); err != nil {
		t.Fatalf("pull.start sent again while the pull runs: %v", err)
	}
	if err := start(b, 7); api.CodeOf(err) != api.CodeBadRequest {
		t.Fatalf("the same pull id for another transfer: want bad_request, got %v", err)
	}
	holder.signal(syscall.SIGCONT)
	d := done.wait(t, 15*time.Second, func(m *messages.PullDone) bool { return m.PullId == "again" })
	if !d.Ok {
		t.Logf("the pull ended with %v (its holder was frozen for a while)", d)
	}
	if n := len(done.all()); n != 1 {
		t.Fatalf("%d pull.done notices for one pull", n)
	}
}
