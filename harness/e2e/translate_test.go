package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/engine/shim"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/kvfill"
	"github.com/connex/connex/kvmem/regionfile"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// shape is one engine's KV shape in these tests: a 4-layer model of 4 KV
// heads of 64 bfloat16 elements, split over tp ranks, in blocks of bs
// tokens laid out in order.
type shape struct {
	order  string
	tp, bs uint32
}

func (s shape) String() string { return fmt.Sprintf("%s/tp%d/bs%d", s.order, s.tp, s.bs) }

// layout is rank rank's layout of an engine of shape s, with blocks blocks.
func (s shape) layout(rank, blocks uint32) kvmem.Layout {
	return describedLayout("e2e-model", 4, 4, 64, s.order, s.tp, rank, s.bs, blocks)
}

// describedLayout is rank rank's layout of a model of layers layers and
// heads KV heads of headSize bfloat16 elements, in an engine of tp ranks
// with blocks of bs tokens in order.
func describedLayout(model string, layers, heads, headSize uint32, order string, tp, rank, bs, blocks uint32) kvmem.Layout {
	l := kvmem.Layout{Layers: layers, Planes: 2, Blocks: blocks, BlockSize: bs, TPSize: tp, TPRank: rank,
		Order: order, Heads: heads, HeadSize: headSize, Dtype: "bfloat16", Model: model}
	if order == kvmem.OrderCPU {
		l.Planes = 1
	}
	_, n := l.HeadRange()
	l.BlockBytes = uint64(n) * uint64(headSize) * 2 * uint64(bs) * uint64(3-l.Planes)
	return l
}

// rankRegion is region.create of region "r<rank>" of engine id laid out as
// l, mapped here as the engine would.
func rankRegion(t testing.TB, nc *nats.Conn, member, id string, l kvmem.Layout) *kvmem.Region {
	t.Helper()
	cli := &api.Client{NC: nc, Member: member}
	// Large regions take a while to reserve and populate on a busy machine.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := cli.CreateRegion(ctx, &messages.CreateRegionRequest{EngineId: id, RegionId: fmt.Sprintf("r%d", l.TPRank), Layout: actors.LayoutToProto(l)})
	if err != nil {
		t.Fatalf("create region of %s rank %d: %v", id, l.TPRank, err)
	}
	r, err := shim.MapCreated(ctx, info, l)
	if err != nil {
		t.Fatalf("map region of %s rank %d: %v", id, l.TPRank, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// rankFile is region.register of region "r<rank>" of engine id laid out as
// l: a region file the engine created.
func rankFile(t testing.TB, nc *nats.Conn, member, id string, l kvmem.Layout) *kvmem.Region {
	t.Helper()
	rid := fmt.Sprintf("r%d", l.TPRank)
	path := filepath.Join(shmDir(t), id+"-"+rid+".kv")
	r, err := regionfile.Create(path, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	cli := &api.Client{NC: nc, Member: member}
	if _, err := cli.RegisterRegion(ctx5(t), &messages.RegisterRegionRequest{EngineId: id, RegionId: rid, Path: path, Layout: actors.LayoutToProto(l)}); err != nil {
		t.Fatalf("register region of %s rank %d: %v", id, l.TPRank, err)
	}
	return r
}

// TestTranslatedPulls moves a prompt's KV between engines of different TP
// sizes, block sizes and in-block orders through real connexd processes,
// on every data plane (and, over UCX, from the engine's own region files
// read one-sided, a key per extent): the prefill engine's hold spans all its ranks, each
// decode rank pulls its own heads from whichever prefill ranks hold them,
// twice (the second as a resume would), and every element of every rank is
// checked token by token and head by head, with nothing else written. A
// decode engine of another head size is refused, naming it.
func TestTranslatedPulls(t *testing.T) {
	pairs := []struct{ p, d shape }{
		{shape{kvmem.OrderNHD, 2, 16}, shape{kvmem.OrderNHD, 2, 16}}, // same shape at TP 2: whole blocks, rank by rank
		{shape{kvmem.OrderNHD, 1, 16}, shape{kvmem.OrderNHD, 2, 16}}, // TP 1 -> 2
		{shape{kvmem.OrderNHD, 2, 16}, shape{kvmem.OrderNHD, 1, 16}}, // TP 2 -> 1
		{shape{kvmem.OrderHND, 4, 16}, shape{kvmem.OrderHND, 2, 16}}, // TP 4 -> 2, head ranges contiguous
		{shape{kvmem.OrderNHD, 1, 16}, shape{kvmem.OrderNHD, 1, 32}}, // block size 16 -> 32
		{shape{kvmem.OrderCPU, 1, 32}, shape{kvmem.OrderCPU, 1, 16}}, // CPU layout regrouped: staged
		{shape{kvmem.OrderNHD, 2, 16}, shape{kvmem.OrderCPU, 1, 8}},  // everything at once
	}
	type variant struct {
		name, backend string
		args          []string
		region        func(t testing.TB, nc *nats.Conn, member, id string, l kvmem.Layout) *kvmem.Region
	}
	variants := []variant{{"tcp", "tcp", nil, rankRegion}}
	if buildTags() == "ucx" {
		// Created regions: one key for the hold, mapped one-sided reads;
		// the engine's own files with onesided reads: a key and segment
		// per extent.
		variants = append(variants, variant{"ucx", "ucx", nil, rankRegion}, variant{"ucx-onesided-files", "ucx", []string{"--ucx-reads", "onesided"}, rankFile})
	}
	for _, v := range variants {
		backend := v.backend
		t.Run(v.name, func(t *testing.T) {
			pn := startConnexd(t, "prefill", append([]string{"--backend", backend}, v.args...)...)
			startConnexd(t, "decode", append([]string{"--backend", backend, "--nats-url", pn.natsURL}, v.args...)...)
			nc := connect(t, pn.natsURL)
			for i, pair := range pairs {
				t.Run(pair.p.String()+"->"+pair.d.String(), func(t *testing.T) {
					translatedPull(t, nc, fmt.Sprintf("P%d", i), fmt.Sprintf("D%d", i), pair.p, pair.d, v.region)
				})
			}
			t.Run("head size refused", func(t *testing.T) {
				p := shape{kvmem.OrderNHD, 1, 16}
				pl, dl := p.layout(0, 64), p.layout(0, 64)
				dl.HeadSize, dl.BlockBytes = 32, dl.BlockBytes/2
				rankRegion(t, nc, "prefill", "Pbad", pl)
				rankRegion(t, nc, "decode", "Dbad", dl)
				cli := &api.Client{NC: nc, Member: "prefill"}
				hold, err := cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: "Pbad", RegionId: "r0", BlockIds: []uint32{1, 2}, NumTokens: 20})
				if err != nil {
					t.Fatal(err)
				}
				done := subscribe(t, nc, api.PullDoneSubject("decode", "Dbad"), func() *messages.PullDone { return new(messages.PullDone) })
				if _, err := (&api.Client{NC: nc, Member: "decode"}).StartPull(ctx5(t), &messages.StartPullRequest{
					Params: hold.Params, EngineId: "Dbad", RegionId: "r0", BlockIds: []uint32{3, 4}, PullId: "bad"}); err != nil {
					t.Fatal(err)
				}
				d := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == "bad" })
				if d.Ok || api.Code(d.ErrorCode) != api.CodeIncompatible || !strings.Contains(d.Error, "head_size 64 vs 32") {
					t.Fatalf("pull into another head size: %v, want incompatible naming head_size", d)
				}
			})
		})
	}
}

// translatedPull holds 100 tokens of prefill engine pid (shape p) and pulls
// them twice into every rank of decode engine did (shape d), verifying
// each.
func translatedPull(t *testing.T, nc *nats.Conn, pid, did string, p, d shape, region func(t testing.TB, nc *nats.Conn, member, id string, l kvmem.Layout) *kvmem.Region) {
	const tokens = 100
	srcIDs := make([]uint32, (tokens+p.bs-1)/p.bs)
	for i := range srcIDs {
		srcIDs[i] = uint32([]int{9, 10, 11, 3, 4, 40, 41, 42, 20, 21, 22, 23, 24}[i]) // runs and scattered blocks
	}
	var rankIDs []string
	for r := range p.tp {
		l := p.layout(r, 64)
		kvfill.Fill(l, region(t, nc, "prefill", pid, l).Bytes(), srcIDs)
		if r > 0 {
			rankIDs = append(rankIDs, fmt.Sprintf("r%d", r))
		}
	}
	pcli := &api.Client{NC: nc, Member: "prefill"}
	hold, err := pcli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pid, RegionId: "r0", RankRegionIds: rankIDs, BlockIds: srcIDs, NumTokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	if hold.Params.TpSize != p.tp || hold.Params.BlockSize != p.bs {
		t.Fatalf("params say tp %d block size %d, want %d %d", hold.Params.TpSize, hold.Params.BlockSize, p.tp, p.bs)
	}
	wantTokens, nDst, err := kvmem.PullSize(p.bs, len(srcIDs), tokens, d.bs)
	if err != nil {
		t.Fatal(err)
	}
	dcli := &api.Client{NC: nc, Member: "decode"}
	done := subscribe(t, nc, api.PullDoneSubject("decode", did), func() *messages.PullDone { return new(messages.PullDone) })
	regions := make([]*kvmem.Region, d.tp)
	for r := range d.tp {
		regions[r] = rankRegion(t, nc, "decode", did, d.layout(r, 64))
	}
	// The first pull into blocks 0.., the second (a resume) into others.
	for attempt, first := range []uint32{0, 30} {
		dstIDs := make([]uint32, nDst)
		for i := range dstIDs {
			dstIDs[i] = first + uint32(2*i) // every other block
		}
		for r := range d.tp {
			id := fmt.Sprintf("pull%d-rank%d", attempt, r)
			if _, err := dcli.StartPull(ctx5(t), &messages.StartPullRequest{Params: hold.Params, EngineId: did, RegionId: fmt.Sprintf("r%d", r), BlockIds: dstIDs, PullId: id}); err != nil {
				t.Fatalf("pull.start of rank %d: %v", r, err)
			}
			pd := done.wait(t, 20*time.Second, func(m *messages.PullDone) bool { return m.PullId == id })
			l := d.layout(r, 64)
			_, hn := l.HeadRange()
			want := uint64(wantTokens) * uint64(hn) * 64 * 2 * 2 * 4
			if !pd.Ok || pd.Bytes != want {
				t.Fatalf("pull %s: ok=%v bytes=%d (want %d) %s", id, pd.Ok, pd.Bytes, want, pd.Error)
			}
			// Alone: nothing but the pulled tokens is written, the first
			// time; the second pull adds its own blocks beside them.
			if err := kvfill.Check(l, regions[r].Bytes(), dstIDs, wantTokens, attempt == 0); err != nil {
				t.Fatalf("pull %s: %v", id, err)
			}
		}
	}
	if _, err := pcli.Release(ctx5(t), &messages.HoldRef{TransferId: hold.Params.TransferId, Requester: did}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		for r := range p.tp {
			ri, err := pcli.InspectRegion(ctx5(t), &messages.RegionRef{EngineId: pid, RegionId: fmt.Sprintf("r%d", r)})
			if err != nil || ri.BlocksHeld != 0 || ri.BlocksReading != 0 {
				return fmt.Errorf("prefill rank %d after release: %v %v", r, ri, err)
			}
		}
		return nil
	})
}
