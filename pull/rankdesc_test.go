package pull

import (
	"errors"
	"testing"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/kvfill"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
	"google.golang.org/protobuf/proto"
)

// rankLayout is rank rank of a TP tp engine: 2 layers, 4 heads of 64
// float16 elements, NHD blocks of 16 tokens.
func rankLayout(tp, rank uint32) kvmem.Layout {
	l := kvmem.Layout{Layers: 2, Planes: 2, Blocks: 16, BlockSize: 16, TPSize: tp, TPRank: rank, Order: kvmem.OrderNHD, Heads: 4, HeadSize: 64, Dtype: "float16"}
	l.BlockBytes = uint64(4/tp) * 64 * 2 * 16
	return l
}

// tpDescriptors describes a hold of ids in a TP tp engine whose rank r's
// region is at address r<<32 under one key, the byte r.
func tpDescriptors(tp uint32, ids []uint32) *messages.Descriptors {
	d := &messages.Descriptors{Layout: actors.LayoutToProto(rankLayout(tp, 0)), BlockIds: ids, ImpliedSegments: true, Rkeys: [][]byte{{0}}}
	for r := uint32(1); r < tp; r++ {
		d.MoreRanks = append(d.MoreRanks, &messages.RankDescriptors{Layout: actors.LayoutToProto(rankLayout(tp, r)), ImpliedSegments: true, Rkeys: [][]byte{{byte(r)}}, RegionAddr: uint64(r) << 32})
	}
	return d
}

// filledRanks is the memory of every rank of a TP tp engine, its blocks ids
// filled (kvfill).
func filledRanks(tp uint32, ids []uint32) [][]byte {
	ranks := make([][]byte, tp)
	for r := range ranks {
		l := rankLayout(tp, uint32(r))
		ranks[r] = make([]byte, l.Size())
		kvfill.Fill(l, ranks[r], ids)
	}
	return ranks
}

// TestTranslatedPlanFromRanks plans a pull from a TP 2 holder into a TP 1
// region and runs its reads against the two ranks' memory: every op reads
// its rank's region under that rank's key, and the destination then holds
// every head of every token.
func TestTranslatedPlanFromRanks(t *testing.T) {
	srcIDs, dstIDs := []uint32{3, 4, 9}, []uint32{7, 1, 2}
	ranks := filledRanks(2, srcIDs)
	dst := mapped(t, rankLayout(1, 0))
	ops, total, err := PlanReads(tpDescriptors(2, srcIDs), srcIDs, dst, dstIDs)
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(len(srcIDs)) * 16 * 4 * 64 * 2 * 2 * 2; total != want {
		t.Fatalf("total %d, want %d", total, want)
	}
	for _, op := range ops {
		r := op.RemoteAddr >> 32
		if len(op.RemoteKey) != 1 || uint64(op.RemoteKey[0]) != r {
			t.Fatalf("op at %#x reads rank %d with key %v", op.RemoteAddr, r, op.RemoteKey)
		}
		off := op.RemoteAddr & (1<<32 - 1)
		copy(op.Dst, ranks[r][off:off+uint64(len(op.Dst))])
	}
	if err := kvfill.Check(rankLayout(1, 0), dst.Region.Bytes(), dstIDs, uint32(len(srcIDs))*16, true); err != nil {
		t.Fatal(err)
	}
}

// TestBadRankDescriptors: descriptors whose ranks do not add up are refused
// before anything is read.
func TestBadRankDescriptors(t *testing.T) {
	srcIDs, dstIDs := []uint32{3, 4}, []uint32{0, 1}
	dst := mapped(t, rankLayout(1, 0))
	cases := map[string]func(d *messages.Descriptors){
		"missing rank":     func(d *messages.Descriptors) { d.MoreRanks = nil },
		"extra rank":       func(d *messages.Descriptors) { d.MoreRanks = append(d.MoreRanks, d.MoreRanks[0]) },
		"rank 0 not first": func(d *messages.Descriptors) { d.Layout.TpRank = 1 },
		"other shape": func(d *messages.Descriptors) {
			d.MoreRanks[0].Layout.BlockSize, d.MoreRanks[0].Layout.BlockBytes = 32, 2*d.MoreRanks[0].Layout.BlockBytes
		},
		"two keys":        func(d *messages.Descriptors) { d.MoreRanks[0].Rkeys = append(d.MoreRanks[0].Rkeys, []byte{9}) },
		"block past end":  func(d *messages.Descriptors) { d.MoreRanks[0].Layout.NumBlocks, d.Layout.NumBlocks = 4, 4 },
		"segments, wrong": func(d *messages.Descriptors) { d.MoreRanks[0].ImpliedSegments = false },
	}
	for name, mut := range cases {
		d := proto.Clone(tpDescriptors(2, srcIDs)).(*messages.Descriptors)
		mut(d)
		if _, _, err := PlanReads(d, srcIDs, dst, dstIDs); !errors.Is(err, ErrBadDescriptors) {
			t.Errorf("%s: want ErrBadDescriptors, got %v", name, err)
		}
	}
}

// TestStridedPlanFromRanks: planned for a data plane that reads strided ops,
// the same pull is one op per holder rank, plane and block (a piece per
// token), whose pieces write the same bytes.
func TestStridedPlanFromRanks(t *testing.T) {
	srcIDs, dstIDs := []uint32{3, 4, 9}, []uint32{7, 1, 2}
	ranks := filledRanks(2, srcIDs)
	dst := mapped(t, rankLayout(1, 0))
	var plan *readPlan
	run, _, err := planPull(tpDescriptors(2, srcIDs), srcIDs, 0, nil, 0, dst, dstIDs, &plan, kvmem.Translate, true)
	if err != nil {
		t.Fatal(err)
	}
	var sops []transport.StridedOp
	if err := run(batchReader{
		get:     func([]transport.GetOp) error { return errors.New("plain GetOps planned for a strided data plane") },
		strided: func(ops []transport.StridedOp) error { sops = ops; return nil },
	}); err != nil {
		t.Fatal(err)
	}
	if want := 2 * 2 * 2 * len(srcIDs); len(sops) != want { // layers × planes × ranks × blocks
		t.Fatalf("%d strided ops, want %d", len(sops), want)
	}
	for _, op := range sops {
		if op.Count != 16 || op.Check() != nil {
			t.Fatalf("strided op %+v: want 16 pieces (%v)", op, op.Check())
		}
		for _, g := range op.AppendPieces(nil) {
			r := g.RemoteAddr >> 32
			off := g.RemoteAddr & (1<<32 - 1)
			copy(g.Dst, ranks[r][off:off+uint64(len(g.Dst))])
		}
	}
	if err := kvfill.Check(rankLayout(1, 0), dst.Region.Bytes(), dstIDs, uint32(len(srcIDs))*16, true); err != nil {
		t.Fatal(err)
	}
}
