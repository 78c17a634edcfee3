package kvmem_test

import (
	"bytes"
	"testing"

	"github.com/connex/connex/kvmem"
)

// TestRegroupMatchesCopies: Regroup writes exactly what a tile's copy runs
// (StagedCopies, each run's CopyOut in turn) write, with its dense path
// (buf, out) and without, for staged translations: the CPU order between
// block sizes up, down and not multiples of each other, with a TP change,
// NHD between TP sizes (32-byte head ranges), and pulls whose last tile
// carries fewer tokens. Bytes the pull does not write stay as they were.
func TestRegroupMatchesCopies(t *testing.T) {
	cpu := func(tp, bs uint32) kvmem.Layout { return described(kvmem.OrderCPU, 4, tp, 0, bs, "bfloat16") }
	cases := []struct {
		name      string
		src, dst  kvmem.Layout
		nSrc      int
		numTokens uint32
	}{
		{"cpu 16->32", cpu(1, 16), cpu(1, 32), 6, 0},
		{"cpu 16->32 part", cpu(1, 16), cpu(1, 32), 6, 5*16 + 5},
		{"cpu 32->16", cpu(1, 32), cpu(1, 16), 3, 0},
		{"cpu 16->48", cpu(1, 16), cpu(1, 48), 6, 0},
		{"cpu 32->48 part", cpu(1, 32), cpu(1, 48), 5, 4*32 + 7},
		{"cpu tp2 16 -> tp1 32", cpu(2, 16), cpu(1, 32), 4, 0},
		{"nhd tp2->1", described(kvmem.OrderNHD, 4, 2, 0, 16, "float32"), described(kvmem.OrderNHD, 4, 1, 0, 16, "float32"), 3, 0},
	}
	for _, c := range cases {
		tr, err := kvmem.Translate(c.src, c.dst)
		if err != nil || !tr.Staged {
			t.Fatalf("%s: staged=%v, %v", c.name, tr != nil && tr.Staged, err)
		}
		srcIDs := make([]uint32, c.nSrc)
		for i := range srcIDs {
			srcIDs[i] = uint32((i*5 + 2) % int(c.src.Blocks))
		}
		_, nDst, err := kvmem.PullSize(c.src.BlockSize, c.nSrc, c.numTokens, c.dst.BlockSize)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		dstIDs := make([]uint32, nDst)
		for i := range dstIDs {
			dstIDs[i] = uint32((i*3 + 1) % int(c.dst.Blocks))
		}
		x, err := tr.ForPull(srcIDs, dstIDs, c.numTokens)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		src := make([][]byte, c.src.TPSize)
		for r := range src {
			src[r] = make([]byte, c.src.Size())
			for i := range src[r] {
				src[r][i] = byte((uint32(i)*2654435761)>>13) ^ byte(r*85)
			}
		}
		// Prefilled destinations: a write outside the pull's bytes shows.
		fill := func() []byte {
			d := make([]byte, c.dst.Size())
			for i := range d {
				d[i] = byte(i*7 + 3)
			}
			return d
		}
		want, direct, dense := fill(), fill(), fill()
		buf := make([]byte, x.RegroupBytes())
		var scratch []byte
		for layer := range tr.Src.Layers {
			for k := range x.Tiles() {
				scratch = make([]byte, x.TileScratch(k))
				x.StagedReads(layer, k, func(m kvmem.Move) { copy(scratch[m.DstOff:m.DstOff+m.Len], src[m.Rank][m.SrcOff:]) })
				x.StagedCopies(layer, k, func(r kvmem.CopyRun, do uint64) { r.CopyOut(want, do, scratch) })
				x.Regroup(layer, k, direct, scratch, nil, nil)
				x.Regroup(layer, k, dense, scratch, buf, func(d, s []byte) {
					if len(d) != len(s) {
						t.Fatalf("%s: out(%d bytes, %d bytes)", c.name, len(d), len(s))
					}
					copy(d, s)
				})
			}
		}
		if !bytes.Equal(direct, want) {
			t.Errorf("%s: Regroup without buf differs from the copy runs", c.name)
		}
		if !bytes.Equal(dense, want) {
			t.Errorf("%s: Regroup with buf differs from the copy runs", c.name)
		}
		var fresh []byte
		x.Copy(src, func() []byte { fresh = fill(); return fresh }())
		if !bytes.Equal(fresh, want) {
			t.Errorf("%s: Transfer.Copy differs from the copy runs", c.name)
		}
	}
}

// TestRegroupShape pins the plan that makes the CPU order's regroup
// between block sizes 16 and 32 fast, which no result shows: the two
// source blocks' K runs (32-byte halves of each 64-byte row of a
// destination block) are performed as pairs, and the whole destination
// block is one dense range (regrouped in a buffer, then moved with
// streaming stores by the puller).
func TestRegroupShape(t *testing.T) {
	tr, err := kvmem.Translate(described(kvmem.OrderCPU, 4, 1, 0, 16, "bfloat16"), described(kvmem.OrderCPU, 4, 1, 0, 32, "bfloat16"))
	if err != nil {
		t.Fatal(err)
	}
	groups, pairs, dense := kvmem.RegroupShape(&tr.Full)
	// 4 heads × K, V: each of the two source blocks' runs pairs with the
	// other's.
	if groups != 1 || pairs != 4*2 || dense != 1 {
		t.Fatalf("full tile: %d groups, %d pairs, %d dense; want 1 group (the destination block), %d pairs, 1 dense", groups, pairs, dense, 4*2)
	}
	x, err := tr.ForPull([]uint32{0, 1, 2, 3}, []uint32{0, 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := x.RegroupBytes(), tr.Dst.BlockBytes; got != want {
		t.Fatalf("RegroupBytes %d, want a destination block (%d)", got, want)
	}
}
