package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// TestPausedHolderRejoinsWithoutFailingPulls: a holder frozen (SIGSTOP)
// past the TTL is evicted; resumed (SIGCONT), it rejoins with a new
// cluster id. Reports of the evicted incarnation's departure that arrive
// after the rejoin must not end pulls the new incarnation serves: every
// pull for the next few seconds succeeds.
func TestPausedHolderRejoinsWithoutFailingPulls(t *testing.T) {
	c := newDecodeCluster(t, "d1")
	d1 := c.engines["d1"]
	prm := c.hold(t, []uint32{1, 2, 3}, 48)
	done := subscribe(t, c.nc, api.PullDoneSubject(d1.cli.Member, d1.id), func() *messages.PullDone { return new(messages.PullDone) })
	n := 0
	pull := func() *messages.PullDone {
		t.Helper()
		n++
		id := fmt.Sprintf("p%d", n)
		if _, err := d1.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: prm, EngineId: d1.id, RegionId: d1.rid, BlockIds: []uint32{4, 5, 6}, PullId: id}); err != nil {
			t.Fatal(err)
		}
		return done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == id })
	}
	if d := pull(); !d.Ok {
		t.Fatalf("pull before the pause: %v", d)
	}
	count := func(p *proc, s string) int { return strings.Count(p.logs(), s) }
	holder, dec := c.procs["prefill"], c.procs["d1"]
	left, joined := count(dec, `msg="member left"`), count(dec, `msg="member joined"`)

	holder.signal(syscall.SIGSTOP)
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if count(dec, `msg="member left"`) == left {
			return fmt.Errorf("the frozen holder is not evicted yet")
		}
		return nil
	})
	holder.signal(syscall.SIGCONT)
	checkFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		if count(holder, "rejoining with a new id") == 0 || count(dec, `msg="member joined"`) == joined {
			return fmt.Errorf("the holder has not rejoined yet")
		}
		return nil
	})
	rejoined := time.Now()
	for time.Since(rejoined) < 3*time.Second {
		if d := pull(); !d.Ok {
			t.Fatalf("pull %s after the holder rejoined: %v\nreader's log:\n%s", time.Since(rejoined).Round(time.Millisecond), d, dec.logs())
		}
	}
	t.Logf("%d pulls in the 3 s after the rejoin, all ok", n-1)
}
