package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

var testLayout = kvmem.Layout{Layers: 4, Planes: 2, Blocks: 32, BlockBytes: 4096, BlockSize: 16, TPSize: 1}

// cluster2 starts a prefill-side connexd with embedded NATS and a
// decode-side connexd using it, with one engine each.
func cluster2(t *testing.T, backend string, extra ...string) (prefill, decode *engine, pn, dn *proc) {
	pn = startConnexd(t, "prefill", append([]string{"--backend", backend}, extra...)...)
	dn = startConnexd(t, "decode", append([]string{"--backend", backend, "--nats-url", pn.natsURL}, extra...)...)
	nc := connect(t, pn.natsURL)
	prefill = newEngine(t, nc, "prefill", "engP", testLayout, true)
	decode = newEngine(t, nc, "decode", "engD", testLayout, false)
	return
}

// verifyBlocks checks that every layer and plane of dst block dstIDs[i]
// equals src block srcIDs[i], and that untouched dst blocks stay zero.
func verifyBlocks(t *testing.T, src, dst *kvmem.Region, srcIDs, dstIDs []uint32, untouched []uint32) {
	t.Helper()
	if err := blocksDiffer(src, dst, srcIDs, dstIDs); err != nil {
		t.Fatal(err)
	}
	l := src.Layout
	for layer := uint32(0); layer < l.Layers; layer++ {
		for p := uint32(0); p < l.Planes; p++ {
			for _, b := range untouched {
				if !bytes.Equal(dst.Block(layer, p, b), make([]byte, l.BlockBytes)) {
					t.Fatalf("layer %d plane %d: block %d outside the pull was written", layer, p, b)
				}
			}
		}
	}
}

// blocksDiffer says where dst's blocks dstIDs differ from src's srcIDs
// (pairwise), or nil when they are the same.
func blocksDiffer(src, dst *kvmem.Region, srcIDs, dstIDs []uint32) error {
	l := src.Layout
	for layer := uint32(0); layer < l.Layers; layer++ {
		for p := uint32(0); p < l.Planes; p++ {
			for i := range srcIDs {
				if !bytes.Equal(src.Block(layer, p, srcIDs[i]), dst.Block(layer, p, dstIDs[i])) {
					return fmt.Errorf("layer %d plane %d: dst block %d differs from src block %d", layer, p, dstIDs[i], srcIDs[i])
				}
			}
		}
	}
	return nil
}

func TestHoldPullReleaseAcrossProcesses(t *testing.T) {
	pe, de, pn, _ := cluster2(t, "tcp")
	nc := pe.cli.NC
	freed := subscribe(t, nc, api.FreedSubject(pe.cli.Member, pe.id), func() *messages.BlocksFreed { return new(messages.BlocksFreed) })
	done := subscribe(t, nc, api.PullDoneSubject(de.cli.Member, de.id), func() *messages.PullDone { return new(messages.PullDone) })

	src := []uint32{3, 4, 5, 9, 1, 31}
	hold, err := pe.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pe.id, RegionId: pe.rid, BlockIds: src, NumTokens: 90, Consumer: de.id})
	if err != nil {
		t.Fatal(err)
	}
	prm := hold.Params
	if len(prm.TransferId) != 32 || prm.RemoteCtrl.GetMember() != "prefill" || !prm.DoRemoteDecode {
		t.Fatalf("params: %v", prm)
	}
	if ri, err := pe.cli.InspectRegion(ctx5(t), &messages.RegionRef{EngineId: pe.id, RegionId: pe.rid}); err != nil || ri.BlocksHeld != uint32(len(src)) {
		t.Fatalf("prefill accounting after hold: %v %v", ri, err)
	}

	// Two pulls of the same hold into different blocks: the hold survives
	// the first pull (on_finish), which is what lets a failed decode resume.
	pulls := []struct {
		id  string
		dst []uint32
	}{{"first", []uint32{0, 1, 2, 7, 8, 20}}, {"again", []uint32{10, 11, 12, 13, 14, 15}}}
	for _, pl := range pulls {
		if _, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: prm, EngineId: de.id, RegionId: de.rid, BlockIds: pl.dst, PullId: pl.id}); err != nil {
			t.Fatal(err)
		}
		d := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == pl.id })
		if !d.Ok || d.Bytes != uint64(len(src))*testLayout.BlockBytes*8 {
			t.Fatalf("pull %s: %v", pl.id, d)
		}
	}
	verifyBlocks(t, pe.region, de.region, src, pulls[0].dst, []uint32{3, 4, 5, 6, 9, 16, 31})
	verifyBlocks(t, pe.region, de.region, src, pulls[1].dst, nil)

	// On an on_finish hold the puller does not wait for the holder's
	// PullEnd acknowledgement before PullDone: the count follows shortly.
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		st, err := pe.cli.Inspect(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId})
		if err != nil || st.State != "held" || st.PullsDone != 2 || st.ActivePulls != 0 || st.Freed {
			return fmt.Errorf("status after pulls: %v %v", st, err)
		}
		return nil
	})
	if len(freed.all()) != 0 {
		t.Fatal("blocks freed before release")
	}
	// Someone else may not release it.
	if _, err := pe.cli.Release(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId, Requester: "intruder"}); api.CodeOf(err) != api.CodeNotYours {
		t.Fatalf("release by a stranger: want not_yours, got %v", err)
	}
	if _, err := de.cli.Release(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId, Requester: de.id}); api.CodeOf(err) != api.CodeUnknownTransfer {
		t.Fatalf("release sent to the wrong member: want unknown_transfer, got %v", err)
	}
	relCli := &api.Client{NC: nc, Member: prm.RemoteCtrl.Member}
	if _, err := relCli.Release(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId, Requester: de.id}); err != nil {
		t.Fatal(err)
	}
	f := freed.wait(t, 5*time.Second, func(m *messages.BlocksFreed) bool { return m.TransferId == prm.TransferId })
	if f.Reason != "released" || fmt.Sprint(f.BlockIds) != fmt.Sprint(src) {
		t.Fatalf("freed notice: %v", f)
	}
	// Releasing twice is an error, frees nothing more, and later pulls are refused.
	if _, err := relCli.Release(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId, Requester: de.id}); api.CodeOf(err) != api.CodeReleased {
		t.Fatalf("second release: want released code, got %v", err)
	}
	if _, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: prm, EngineId: de.id, RegionId: de.rid, BlockIds: pulls[0].dst, PullId: "late"}); err != nil {
		t.Fatal(err)
	}
	late := done.wait(t, 5*time.Second, func(m *messages.PullDone) bool { return m.PullId == "late" })
	if late.Ok || late.ErrorCode != uint32(api.CodeReleased) {
		t.Fatalf("pull after release: %v", late)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := len(freed.all()); n != 1 {
		t.Fatalf("freed notices: %d, want exactly 1", n)
	}
	for _, e := range []*engine{pe, de} {
		ri, err := e.cli.InspectRegion(ctx5(t), &messages.RegionRef{EngineId: e.id, RegionId: e.rid})
		if err != nil || ri.BlocksFree != testLayout.Blocks {
			t.Fatalf("%s accounting after release: %v %v", e.id, ri, err)
		}
	}
	if !pn.running() {
		t.Fatal("prefill connexd died")
	}
	// The counters are served in the micro service's STATS replies (one
	// per member); the prefill member's shows the hold.
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SRV.STATS.connex", inbox, nil); err != nil {
		t.Fatal(err)
	}
	var replies []string
	for {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("no STATS reply shows the hold: %v %q", err, replies)
		}
		replies = append(replies, string(m.Data))
		if strings.Contains(string(m.Data), `"member":"prefill"`) {
			if !strings.Contains(string(m.Data), `"holds_created":1`) || !strings.Contains(string(m.Data), `"double_frees":0`) {
				t.Fatalf("prefill stats: %s", m.Data)
			}
			break
		}
	}
}

func TestLeaseExpiryRefusesPullAndFrees(t *testing.T) {
	pe, de, _, _ := cluster2(t, "tcp")
	nc := pe.cli.NC
	freed := subscribe(t, nc, api.FreedSubject(pe.cli.Member, pe.id), func() *messages.BlocksFreed { return new(messages.BlocksFreed) })
	done := subscribe(t, nc, api.PullDoneSubject(de.cli.Member, de.id), func() *messages.PullDone { return new(messages.PullDone) })
	created := time.Now()
	hold, err := pe.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pe.id, RegionId: pe.rid, BlockIds: []uint32{0, 1, 2}, RetainS: 1})
	if err != nil {
		t.Fatal(err)
	}
	f := freed.wait(t, 10*time.Second, func(m *messages.BlocksFreed) bool { return m.TransferId == hold.Params.TransferId })
	if f.Reason != "expired" {
		t.Fatalf("freed reason %q, want expired", f.Reason)
	}
	if el := time.Since(created); el < time.Second {
		t.Fatalf("freed after %s, before retain_s=1 passed", el)
	}
	if _, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: hold.Params, EngineId: de.id, RegionId: de.rid, BlockIds: []uint32{5, 6, 7}, PullId: "p1"}); err != nil {
		t.Fatal(err)
	}
	d := done.wait(t, 5*time.Second, func(m *messages.PullDone) bool { return m.PullId == "p1" })
	if d.Ok || d.ErrorCode != uint32(api.CodeExpired) {
		t.Fatalf("pull of an expired transfer: %v", d)
	}
	_, err = pe.cli.Renew(ctx5(t), &messages.HoldRef{TransferId: hold.Params.TransferId})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeExpired {
		t.Fatalf("renew after expiry: %v", err)
	}
	ri, err := pe.cli.InspectRegion(ctx5(t), &messages.RegionRef{EngineId: pe.id, RegionId: pe.rid})
	if err != nil || ri.BlocksFree != testLayout.Blocks {
		t.Fatalf("accounting after expiry: %v %v", ri, err)
	}
	if n := len(freed.all()); n != 1 {
		t.Fatalf("freed %d times", n)
	}
	// The destination blocks of the refused pull are writable again.
	ri, err = de.cli.InspectRegion(ctx5(t), &messages.RegionRef{EngineId: de.id, RegionId: de.rid})
	if err != nil || ri.BlocksWriting != 0 {
		t.Fatalf("decode accounting after refused pull: %v %v", ri, err)
	}
}

// TestPullDialsOnlyAdvertisedDataAddresses: a puller connects to the
// holder's data plane while the descriptors travel, but only to an address
// a member advertised in earlier descriptors: transfer params come from
// engines and routers, and a data_addr forged into them is never dialled
// (the pull reads from the address the holder's descriptors give).
func TestPullDialsOnlyAdvertisedDataAddresses(t *testing.T) {
	pe, de, _, _ := cluster2(t, "tcp")
	nc := pe.cli.NC
	done := subscribe(t, nc, api.PullDoneSubject(de.cli.Member, de.id), func() *messages.PullDone { return new(messages.PullDone) })
	trap, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer trap.Close()
	var dialled atomic.Int32
	go func() {
		for {
			c, err := trap.Accept()
			if err != nil {
				return
			}
			dialled.Add(1)
			c.Close()
		}
	}()
	src := []uint32{2, 5, 9}
	hold, err := pe.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pe.id, RegionId: pe.rid, BlockIds: src})
	if err != nil {
		t.Fatal(err)
	}
	forged := proto.Clone(hold.Params).(*messages.KVTransferParams)
	forged.RemoteCtrl.DataAddr = []byte(trap.Addr().String())
	// First with the true params (the address becomes known), then twice
	// with the forged one: the first forged pull has nothing to dial early,
	// the second must not dial an address only params named either.
	for i, prm := range []*messages.KVTransferParams{hold.Params, forged, forged} {
		id := fmt.Sprintf("p%d", i)
		dst := []uint32{uint32(3 * i), uint32(3*i + 1), uint32(3*i + 2)}
		if _, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: prm, EngineId: de.id, RegionId: de.rid, BlockIds: dst, PullId: id}); err != nil {
			t.Fatal(err)
		}
		d := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == id })
		if !d.Ok {
			t.Fatalf("pull %s: %v", id, d)
		}
		verifyBlocks(t, pe.region, de.region, src, dst, nil)
	}
	// A dial would have been accepted by now (each pull waited for its
	// descriptors, which take longer than a local connect).
	if n := dialled.Load(); n != 0 {
		t.Fatalf("the puller dialled the data address forged into the params %d times", n)
	}
}

// TestPullAcrossAdjacentExtents: a hold of the last and the first block of
// a layer has extents that touch across planes (plane 0's last block ends
// where plane 1's first begins); pulled into the same positions, the
// reader joins those reads, and the holder must serve the joined read
// (it refused it with not_registered before registrations joined
// adjacent extents).
func TestPullAcrossAdjacentExtents(t *testing.T) {
	for _, backend := range backends() {
		t.Run(backend, func(t *testing.T) {
			pe, de, _, _ := cluster2(t, backend)
			done := subscribe(t, pe.cli.NC, api.PullDoneSubject(de.cli.Member, de.id), func() *messages.PullDone { return new(messages.PullDone) })
			last := testLayout.Blocks - 1
			src := []uint32{last, 0}
			hold, err := pe.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pe.id, RegionId: pe.rid, BlockIds: src})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: hold.Params, EngineId: de.id, RegionId: de.rid, BlockIds: src, PullId: "adj"}); err != nil {
				t.Fatal(err)
			}
			if d := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == "adj" }); !d.Ok {
				t.Fatalf("pull across adjacent extents: %v", d)
			}
			verifyBlocks(t, pe.region, de.region, src, src, []uint32{1, last - 1})
		})
	}
}
