package pull

import (
	"bytes"
	"errors"
	"testing"

	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/kvfill"
)

// TestPullPicksEachGroup: a hold of two KV cache groups ([9 1] and [7 2])
// pulled less one cached block of the second group reads hold positions
// 0, 1 and 3: blocks 1 and 2 are consecutive ids from positions that are
// not, and with a segment per run of the hold ([9] [1] [7] [2]) each read
// must stay inside its own segment (runPick checks that) and land in the
// destination block paired with it, nothing else written.
func TestPullPicksEachGroup(t *testing.T) {
	l := rankLayout(1, 0)
	srcIDs := []uint32{9, 1, 7, 2}
	src := make([]byte, l.Size())
	kvfill.Fill(l, src, srcIDs)
	dst := mapped(t, l)
	pick, dstIDs := []int{0, 1, 3}, []uint32{4, 5, 6}
	if err := runPick(t, segmentDescriptors(l, srcIDs), [][]byte{src}, srcIDs, 0, pick, 0, dst, dstIDs); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, l.Size())
	for i, at := range pick {
		for layer := uint32(0); layer < l.Layers; layer++ {
			for p := uint32(0); p < l.Planes; p++ {
				from, to := l.Offset(layer, p, srcIDs[at]), l.Offset(layer, p, dstIDs[i])
				copy(want[to:to+l.BlockBytes], src[from:from+l.BlockBytes])
			}
		}
	}
	if !bytes.Equal(dst.Region.Bytes(), want) {
		t.Fatal("the destination region is not the picked blocks in their paired blocks, and nothing else")
	}
	if got := splitRuns(kvmem.Runs(picked(srcIDs, 0, pick)), pick); len(got) != 3 {
		t.Fatalf("runs of the picked ids %v: %v, want [9] [1] [2] (1 and 2 come from positions 1 and 3)", picked(srcIDs, 0, pick), got)
	}
}

// TestPullPickNeedsTheRegionsShape: picked blocks move whole; a holder of
// another TP size is refused before anything is read, as is a position
// outside the hold.
func TestPullPickNeedsTheRegionsShape(t *testing.T) {
	srcIDs := []uint32{3, 4}
	dst := mapped(t, rankLayout(1, 0))
	if err := runPick(t, tpDescriptors(2, srcIDs), filledRanks(2, srcIDs), srcIDs, 0, []int{1}, 0, dst, []uint32{0}); !errors.Is(err, kvmem.ErrIncompatible) {
		t.Fatalf("a TP 2 holder: %v, want ErrIncompatible", err)
	}
	if err := runPick(t, tpDescriptors(1, srcIDs), filledRanks(1, srcIDs), srcIDs, 0, []int{2}, 0, dst, []uint32{0}); !errors.Is(err, kvmem.ErrBadBlockIDs) {
		t.Fatalf("position 2 of a hold of 2: %v, want ErrBadBlockIDs", err)
	}
}
