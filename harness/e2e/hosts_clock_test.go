package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/daemon"
	"github.com/connex/connex/harness/netlab"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// TestHostsClockSkew runs the prefill member with its wall clock 30 s
// behind and a decode member with its clock 45 s ahead
// (daemon.ClockSkewEnv), with 2 s leases: a pull across them works, the
// running request keeps its hold alive well past one lease, the request
// fails over to an unskewed member that pulls the same hold again, the
// finish frees the hold, and a hold nobody renews expires after its lease,
// not at once nor never. Leases and TTLs are durations on the member that
// keeps them; no decision compares two members' clocks.
func TestHostsClockSkew(t *testing.T) {
	l := newHostLab(t, 3)
	h1, h2, h3 := l.lab.Hosts[0], l.lab.Hosts[1], l.lab.Hosts[2]
	c := &hostPD{hostLab: l, procs: map[string]*proc{}, engines: map[string]*engine{}, ncs: map[string]*nats.Conn{}}
	c.prefill = l.connexdWith(h1, "p1", []string{daemon.ClockSkewEnv + "=-30s"}, "--role", "prefill", "--retain-s", "2")
	c.procs["p1"] = c.prefill
	c.procs["d2"] = l.connexdWith(h2, "d2", []string{daemon.ClockSkewEnv + "=45s"}, "--role", "decode")
	c.procs["d3"] = l.connexd(h3, "d3", "--role", "decode")
	for name, h := range map[string]*netlab.Host{"p1": h1, "d2": h2, "d3": h3} {
		c.ncs[name] = l.conn(h)
	}
	c.engP = newEngine(t, c.ncs["p1"], "p1", "engP", testLayout, true)
	for _, d := range []string{"d2", "d3"} {
		c.engines[d] = newEngine(t, c.ncs[d], d, "eng-"+d, testLayout, false)
	}
	c.waitMembers(3)
	if !strings.Contains(c.prefill.logs(), "wall clock is shifted") {
		t.Fatal("the prefill member did not take the clock skew")
	}

	src := []uint32{1, 2, 3, 4}
	prm := c.hold(t, src, 64)
	created := time.Now()
	if d := c.pullOn(t, "d2", "skewed", prm, []uint32{5, 6, 7, 8}, 10*time.Second); !d.Ok {
		t.Fatalf("pull between skewed members: %v", d)
	}
	verifyBlocks(t, c.engP.region, c.engines["d2"].region, src, []uint32{5, 6, 7, 8}, nil)
	d2 := c.engines["d2"]
	if _, err := d2.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-skew", Params: prm, PromptTokenIds: prompt(64), EngineId: d2.id}); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.cli.Progress(ctx5(t), &messages.RequestProgress{RequestId: "r-skew", Epoch: 1, TokenIds: []uint32{7, 8}}); err != nil {
		t.Fatal(err)
	}
	// The running request renews the hold: it is held for three leases.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for time.Since(created) < 6*time.Second {
		hs, err := c.engP.cli.Inspect(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId})
		if err != nil || hs.State != "held" {
			t.Fatalf("hold %s after creation, with its request running: %v %v", time.Since(created).Round(time.Millisecond), hs, err)
		}
		<-tick.C
	}
	res := subscribe(t, c.ncs["d3"], "connex.v1.engine.*.*.request.resume", func() *messages.ResumeNotice { return new(messages.ResumeNotice) })
	c.procs["d2"].kill()
	n := res.wait(t, 20*time.Second, func(m *messages.ResumeNotice) bool { return m.State.RequestId == "r-skew" })
	if n.State.Owner != "d3" || n.State.Epoch != 2 || !slices.Equal(n.State.GeneratedTokenIds, []uint32{7, 8}) {
		t.Fatalf("adopted state: %v", n.State)
	}
	if d := c.pullOn(t, "d3", "adopted", n.State.Params, []uint32{5, 6, 7, 8}, 10*time.Second); !d.Ok {
		t.Fatalf("adopter's pull: %v", d)
	}
	freed := subscribe(t, c.ncs["p1"], api.FreedSubject(c.engP.cli.Member, c.engP.id), func() *messages.BlocksFreed { return new(messages.BlocksFreed) })
	if _, err := c.engines["d3"].cli.FinishRequest(ctx5(t), &messages.FinishRequestMsg{RequestId: "r-skew", Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	freed.wait(t, 10*time.Second, func(m *messages.BlocksFreed) bool { return m.TransferId == prm.TransferId })

	// A hold nobody pulls or renews ends with its lease.
	lone := c.hold(t, []uint32{9}, 16)
	born := time.Now()
	checkFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		hs, err := c.engP.cli.Inspect(ctx5(t), &messages.HoldRef{TransferId: lone.TransferId})
		if err == nil && hs.State == "held" {
			return fmt.Errorf("still held")
		}
		return nil
	})
	lived := time.Since(born)
	if lived < 2*time.Second {
		t.Fatalf("a 2 s lease ended after %s", lived.Round(time.Millisecond))
	}
	t.Logf("an unrenewed 2 s lease on the member 30 s behind ended after %s", lived.Round(time.Millisecond))
}
