package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/harness/netlab"
	"github.com/connex/connex/messages"
)

// TestHostsDecodeHostIsolated cuts a decode host off from the other hosts
// (its NATS server with it: the minority side of the cluster) while it runs
// a request: the request is adopted on the majority side with its tokens,
// the adopter pulls the same hold from the prefill host (no second
// prefill), the isolated side cannot write the request, and once the
// partition heals the isolated member's write is fenced and its engine told
// so.
func TestHostsDecodeHostIsolated(t *testing.T) {
	c := newHostPD(t, 3)
	src := []uint32{2, 3, 4, 5}
	prm := c.hold(t, src, 64)
	p := prompt(64)
	d2 := c.engines["d2"]
	if _, err := d2.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-iso", Params: prm, PromptTokenIds: p, EngineId: d2.id}); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.cli.Progress(ctx5(t), &messages.RequestProgress{RequestId: "r-iso", Epoch: 1, TokenIds: []uint32{7, 8, 9}}); err != nil {
		t.Fatal(err)
	}
	res := subscribe(t, c.ncs["d3"], "connex.v1.engine.*.*.request.resume", func() *messages.ResumeNotice { return new(messages.ResumeNotice) })
	h2 := c.lab.Hosts[1]
	isolated := time.Now()
	if err := h2.Isolate(); err != nil {
		t.Fatal(err)
	}
	n := res.wait(t, 30*time.Second, func(m *messages.ResumeNotice) bool { return m.State.RequestId == "r-iso" })
	t.Logf("isolate h2 -> resume notice: %s, now on %s", time.Since(isolated).Round(time.Millisecond), n.State.Owner)
	st := n.State
	if st.Owner != "d3" || st.Epoch != 2 || !slices.Equal(st.GeneratedTokenIds, []uint32{7, 8, 9}) || !slices.Equal(st.PromptTokenIds, p) || st.Params.TransferId != prm.TransferId {
		t.Fatalf("adopted state: %v", st)
	}
	dst := []uint32{10, 11, 12, 13}
	if d := c.pullOn(t, "d3", "after-isolation", st.Params, dst, 10*time.Second); !d.Ok {
		t.Fatalf("adopter's pull of the same hold: %v", d)
	}
	verifyBlocks(t, c.engP.region, c.engines["d3"].region, src, dst, nil)
	if _, err := c.engines["d3"].cli.Progress(ctx5(t), &messages.RequestProgress{RequestId: "r-iso", Epoch: 2, TokenIds: []uint32{10}}); err != nil {
		t.Fatalf("progress on the adopter: %v", err)
	}
	// The minority side has no JetStream quorum: the isolated member's
	// write fails.
	if _, err := d2.cli.Progress(ctx5(t), &messages.RequestProgress{RequestId: "r-iso", Epoch: 1, TokenIds: []uint32{66}}); err == nil {
		t.Fatal("the isolated member wrote the request")
	} else {
		t.Logf("isolated member's progress: %v (code %d)", err, api.CodeOf(err))
	}
	fenced := subscribe(t, c.ncs["d2"], api.FencedSubject(d2.cli.Member, d2.id), func() *messages.FencedNotice { return new(messages.FencedNotice) })
	healed := time.Now()
	if err := h2.Heal(); err != nil {
		t.Fatal(err)
	}
	// Once NATS routes are back, the stale owner's write is fenced.
	checkFor(t, 60*time.Second, 200*time.Millisecond, func() error {
		_, err := d2.cli.Progress(ctx5(t), &messages.RequestProgress{RequestId: "r-iso", Epoch: 1, TokenIds: []uint32{99}})
		if api.CodeOf(err) != api.CodeFenced {
			return fmt.Errorf("stale owner's progress after the heal: %v", err)
		}
		return nil
	})
	t.Logf("heal -> stale owner fenced: %s", time.Since(healed).Round(time.Millisecond))
	f := fenced.wait(t, 10*time.Second, func(m *messages.FencedNotice) bool { return m.RequestId == "r-iso" })
	if f.NewOwner != "d3" || f.StaleEpoch != 1 {
		t.Fatalf("fenced notice %v", f)
	}
	cur, err := c.engines["d3"].cli.InspectRequest(ctx5(t), &messages.RequestRef{RequestId: "r-iso"})
	if err != nil || cur.State.Owner != "d3" || cur.State.Epoch != 2 || !slices.Equal(cur.State.GeneratedTokenIds, []uint32{7, 8, 9, 10}) {
		t.Fatalf("state after the heal: %v %v", cur, err)
	}
	c.waitMembers(3)
	hs, err := c.engP.cli.Inspect(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId})
	if err != nil || hs.State != "held" {
		t.Fatalf("hold after the partition: %v %v", hs, err)
	}
}

// TestHostsDataPlanePartition cuts only the data plane between a decode host
// and the prefill host (nftables drops on the prefill member's data port,
// both ways); NATS between them still works. connexd does not retry such a
// pull: it fails it with a clear code within pull_stall_ms, and the hold
// stays, so that the engine's retry, or a resume on a decode host that
// reaches the prefill host, reads the same KV without a second prefill.
func TestHostsDataPlanePartition(t *testing.T) {
	c := newHostPD(t, 3)
	src := []uint32{1, 2, 3, 4}
	prm := c.hold(t, src, 64)
	h1, h2 := c.lab.Hosts[0], c.lab.Hosts[1]
	port := netlab.Port(c.prefill.dataAddr)
	if err := h2.AddDrop(netlab.Drop{To: h1, Port: port}); err != nil {
		t.Fatal(err)
	}
	if err := h1.AddDrop(netlab.Drop{To: h2, Port: port}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	d := c.pullOn(t, "d2", "cut", prm, []uint32{8, 9, 10, 11}, 30*time.Second)
	if d.Ok || d.ErrorCode == 0 || d.Error == "" {
		t.Fatalf("pull across the cut data plane: %v", d)
	}
	t.Logf("pull across the cut data plane failed after %s: code %d (%s): %s", time.Since(t0).Round(time.Millisecond), d.ErrorCode, api.Code(d.ErrorCode).Name(), d.Error)
	// The control plane between the two hosts still works: the decode
	// host's engine reads the hold on the prefill member.
	holder := &api.Client{NC: c.ncs["d2"], Member: "p1"}
	if hs, err := holder.Inspect(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId}); err != nil || hs.State != "held" {
		t.Fatalf("hold seen from the cut host: %v %v", hs, err)
	}
	// Another decode host reaches the prefill host meanwhile.
	if d := c.pullOn(t, "d3", "other-host", prm, []uint32{8, 9, 10, 11}, 10*time.Second); !d.Ok {
		t.Fatalf("pull from the other decode host: %v", d)
	}
	verifyBlocks(t, c.engP.region, c.engines["d3"].region, src, []uint32{8, 9, 10, 11}, nil)
	if err := h2.ClearDrops(); err != nil {
		t.Fatal(err)
	}
	if err := h1.ClearDrops(); err != nil {
		t.Fatal(err)
	}
	if d := c.pullOn(t, "d2", "retry", prm, []uint32{8, 9, 10, 11}, 10*time.Second); !d.Ok {
		t.Fatalf("retry after the data plane is back: %v", d)
	}
	verifyBlocks(t, c.engP.region, c.engines["d2"].region, src, []uint32{8, 9, 10, 11}, nil)
}
