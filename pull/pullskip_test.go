package pull

import (
	"errors"
	"testing"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/kvfill"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
)

// runPlan plans a pull of the hold srcIDs (its first skip left out) into
// dstIDs of dst and performs its reads against the holder ranks' memory
// (rank r's region at address r<<32, as tpDescriptors says).
func runPlan(t *testing.T, desc *messages.Descriptors, ranks [][]byte, srcIDs []uint32, skip int, tokens uint32, dst *kvmem.Mapped, dstIDs []uint32) error {
	return runPick(t, desc, ranks, srcIDs, skip, nil, tokens, dst, dstIDs)
}

// runPick is runPlan for a pull of the hold positions pick (Pull.Pick).
func runPick(t *testing.T, desc *messages.Descriptors, ranks [][]byte, srcIDs []uint32, skip int, pick []int, tokens uint32, dst *kvmem.Mapped, dstIDs []uint32) error {
	t.Helper()
	var plan *readPlan
	run, _, err := planPull(desc, srcIDs, skip, pick, tokens, dst, dstIDs, &plan, kvmem.Translate, false)
	if err != nil {
		return err
	}
	return run(batchReader{get: func(ops []transport.GetOp) error {
		for _, op := range ops {
			if !desc.ImpliedSegments {
				// Each read must stay inside the segment its key names.
				sg := desc.Segments[op.RemoteKey[0]]
				if op.RemoteAddr < sg.RemoteAddr || op.RemoteAddr+uint64(len(op.Dst)) > sg.RemoteAddr+sg.Length {
					t.Fatalf("a read at %d+%d under key %d, whose segment is %d+%d", op.RemoteAddr, len(op.Dst), op.RemoteKey[0], sg.RemoteAddr, sg.Length)
				}
			}
			r := op.RemoteAddr >> 32
			off := op.RemoteAddr & (1<<32 - 1)
			copy(op.Dst, ranks[r][off:off+uint64(len(op.Dst))])
		}
		return nil
	}})
}

// TestPullSkipsLeadingBlocks (issue 45): a decode engine that caches the
// first blocks of a prompt pulls only the rest of the hold — whole blocks
// from a holder of its shape, and translated from a TP 2 holder and from a
// holder of twice its block size — and its region then holds every token
// once: the cached ones where its cache had them, the pulled ones in the
// blocks it named, nothing written anywhere else.
func TestPullSkipsLeadingBlocks(t *testing.T) {
	big := func(tp, rank uint32) kvmem.Layout { // blocks of 32 tokens
		l := rankLayout(tp, rank)
		l.BlockSize, l.BlockBytes = 32, 2*l.BlockBytes
		return l
	}
	for _, tc := range []struct {
		name   string
		src    func(tp, rank uint32) kvmem.Layout
		tp     uint32
		srcIDs []uint32
		skip   int
		cached []uint32 // destination blocks the skipped tokens are in
		dstIDs []uint32
	}{
		{"whole", rankLayout, 1, []uint32{3, 4, 9, 10}, 2, []uint32{5, 6}, []uint32{1, 2}},
		{"tp2", rankLayout, 2, []uint32{3, 4, 9}, 1, []uint32{5}, []uint32{1, 2}},
		{"block-size-32", big, 1, []uint32{3, 4, 9}, 1, []uint32{5, 6}, []uint32{1, 2, 7, 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sl := tc.src(tc.tp, 0)
			desc := &messages.Descriptors{Layout: actors.LayoutToProto(sl), BlockIds: tc.srcIDs, ImpliedSegments: true, Rkeys: [][]byte{{0}}}
			ranks := [][]byte{make([]byte, sl.Size())}
			kvfill.Fill(sl, ranks[0], tc.srcIDs)
			for r := uint32(1); r < tc.tp; r++ {
				l := tc.src(tc.tp, r)
				desc.MoreRanks = append(desc.MoreRanks, &messages.RankDescriptors{Layout: actors.LayoutToProto(l), ImpliedSegments: true, Rkeys: [][]byte{{byte(r)}}, RegionAddr: uint64(r) << 32})
				ranks = append(ranks, make([]byte, l.Size()))
				kvfill.Fill(l, ranks[r], tc.srcIDs)
			}
			dl := rankLayout(1, 0)
			dst := mapped(t, dl)
			kvfill.Fill(dl, dst.Region.Bytes(), tc.cached) // the engine's own prefix cache
			tokens := uint32(len(tc.srcIDs)) * sl.BlockSize
			if err := runPlan(t, desc, ranks, tc.srcIDs, tc.skip, tokens, dst, tc.dstIDs); err != nil {
				t.Fatal(err)
			}
			if err := kvfill.Check(dl, dst.Region.Bytes(), append(append([]uint32{}, tc.cached...), tc.dstIDs...), tokens, true); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPullSkipRefused: a skip that leaves nothing to read, or whose tokens
// end inside a destination block, is refused before anything is read.
func TestPullSkipRefused(t *testing.T) {
	srcIDs := []uint32{3, 4}
	desc := tpDescriptors(1, srcIDs)
	ranks := filledRanks(1, srcIDs)
	dst := mapped(t, rankLayout(1, 0))
	if err := runPlan(t, desc, ranks, srcIDs, 2, 0, dst, nil); !errors.Is(err, kvmem.ErrBadBlockIDs) {
		t.Fatalf("skipping every block: %v, want ErrBadBlockIDs", err)
	}
	// A holder of 8-token blocks: one skipped block is half a block here.
	l := rankLayout(1, 0)
	l.BlockSize, l.BlockBytes = 8, l.BlockBytes/2
	d8 := &messages.Descriptors{Layout: actors.LayoutToProto(l), BlockIds: []uint32{1, 2, 3, 4}, ImpliedSegments: true, Rkeys: [][]byte{{0}}}
	if err := runPlan(t, d8, [][]byte{make([]byte, l.Size())}, []uint32{1, 2, 3, 4}, 1, 24, dst, []uint32{0, 1}); !errors.Is(err, kvmem.ErrBadBlockIDs) {
		t.Fatalf("skipping half a destination block: %v, want ErrBadBlockIDs", err)
	}
}

// TestPullSkipWithSegments: a holder that registered its hold in runs (a
// segment per run of consecutive blocks) is read at the right addresses
// when the skip ends inside a run.
func TestPullSkipWithSegments(t *testing.T) {
	l := rankLayout(1, 0)
	srcIDs := []uint32{1, 2, 3, 6} // runs [1 2 3] and [6]
	src := make([]byte, l.Size())
	kvfill.Fill(l, src, srcIDs)
	dst := mapped(t, l)
	kvfill.Fill(l, dst.Region.Bytes(), []uint32{0})
	if err := runPlan(t, segmentDescriptors(l, srcIDs), [][]byte{src}, srcIDs, 1, 0, dst, []uint32{4, 5, 7}); err != nil {
		t.Fatal(err)
	}
	if err := kvfill.Check(l, dst.Region.Bytes(), []uint32{0, 4, 5, 7}, 4*l.BlockSize, true); err != nil {
		t.Fatal(err)
	}
}
