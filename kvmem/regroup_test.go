package kvmem_test

import (
	"bytes"
	"testing"

	"github.com/connex/connex/transport/memcopy"

	"github.com/connex/connex/kvmem"
)

// TestRegroupMatchesCopies: Regroup writes exactly what a tile's copy runs
// (StagedCopies, each run's CopyOut in turn) write, with its dense path
// (buf, out) and without, and so does RegroupFrom from views of the
// holder's memory (each read's bytes in place, in a slice of their own:
// a run that strayed out of its read's span would panic or copy other
// bytes), for staged translations: the CPU order between block sizes up,
// down and not multiples of each other, with a TP change either way, NHD
// between TP sizes (32-byte head ranges), and pulls whose last tile
// carries fewer tokens. Bytes the pull does not write stay as they were.
func TestRegroupMatchesCopies(t *testing.T) {
	cpu := func(tp, bs uint32) kvmem.Layout { return described(kvmem.OrderCPU, 4, tp, 0, bs, "bfloat16") }
	// Heads of 64 elements: a V copy of a source block is 2 KiB or more,
	// moved straight with out.
	cpu64 := func(bs uint32) kvmem.Layout {
		l := described(kvmem.OrderCPU, 2, 1, 0, bs, "bfloat16")
		l.HeadSize, l.BlockBytes = 64, 2*64*2*uint64(bs)*2
		return l
	}
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
		{"cpu tp1 16 -> tp2 rank 1 32 part", cpu(1, 16), described(kvmem.OrderCPU, 4, 2, 1, 32, "bfloat16"), 5, 4*16 + 9},
		{"nhd tp2 16 -> tp1 48", described(kvmem.OrderNHD, 4, 2, 0, 16, "float32"), described(kvmem.OrderNHD, 4, 1, 0, 48, "float32"), 6, 0},
		{"nhd tp2->1", described(kvmem.OrderNHD, 4, 2, 0, 16, "float32"), described(kvmem.OrderNHD, 4, 1, 0, 16, "float32"), 3, 0},
		{"cpu head 64 16->32 part", cpu64(16), cpu64(32), 5, 4*16 + 1},
		{"cpu head 64 32->16", cpu64(32), cpu64(16), 3, 0},
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
		viewed, viewedDense, viewedWoven, wovenScratch := fill(), fill(), fill(), fill()
		woven := 0 // pairs Interleave wrote
		weave := func(d, a, b []byte, half int) bool {
			if len(a) != len(b) || len(d) != 2*len(a) || len(a)%half != 0 {
				t.Fatalf("%s: Interleave(%d, %d, %d bytes, half %d)", c.name, len(d), len(a), len(b), half)
			}
			for i := 0; i < len(a); i += half {
				copy(d[2*i:], a[i:i+half])
				copy(d[2*i+half:], b[i:i+half])
			}
			woven++
			return true
		}
		buf := make([]byte, x.RegroupBytes())
		var scratch []byte
		straight := 0 // copies out moved from the scratch, not buf
		for layer := range tr.Src.Layers {
			for k := range x.Tiles() {
				scratch = make([]byte, x.TileScratch(k))
				var views [][]byte
				x.StagedReads(layer, k, func(m kvmem.Move) {
					copy(scratch[m.DstOff:m.DstOff+m.Len], src[m.Rank][m.SrcOff:])
					views = append(views, src[m.Rank][m.SrcOff:m.SrcOff+m.Len:m.SrcOff+m.Len])
				})
				x.RegroupFrom(layer, k, viewed, views, nil, kvmem.Out{})
				x.RegroupFrom(layer, k, viewedDense, views, buf, kvmem.Out{Copy: func(d, s []byte) { copy(d, s) }})
				x.RegroupFrom(layer, k, viewedWoven, views, buf, kvmem.Out{Copy: func(d, s []byte) { copy(d, s) }, Interleave: weave})
				x.Regroup(layer, k, wovenScratch, scratch, buf, kvmem.Out{Copy: func(d, s []byte) { memcopy.StreamUnfenced(d, s) }, Interleave: memcopy.InterleaveUnfenced})
				memcopy.Fence()
				x.Regroup(layer, k, make([]byte, len(want)), scratch, buf, kvmem.Out{Copy: func(d, s []byte) {
					if len(s) >= 2<<10 && (len(buf) == 0 || &s[0] != &buf[0]) {
						straight++
					}
				}})
				x.StagedCopies(layer, k, func(r kvmem.CopyRun, do uint64) { r.CopyOut(want, do, scratch) })
				x.Regroup(layer, k, direct, scratch, nil, kvmem.Out{})
				x.Regroup(layer, k, dense, scratch, buf, kvmem.Out{Copy: func(d, s []byte) {
					if len(d) != len(s) {
						t.Fatalf("%s: out(%d bytes, %d bytes)", c.name, len(d), len(s))
					}
					copy(d, s)
				}})
			}
		}
		if !bytes.Equal(direct, want) {
			t.Errorf("%s: Regroup without buf differs from the copy runs", c.name)
		}
		if !bytes.Equal(dense, want) {
			t.Errorf("%s: Regroup with buf differs from the copy runs", c.name)
		}
		if (c.src.HeadSize == 64) != (straight > 0) {
			// A V copy of a source block (2 KiB: 16 tokens of a head of
			// 64) goes out straight; no copy of the small heads does.
			t.Errorf("%s: %d copies went out straight", c.name, straight)
		}
		if !bytes.Equal(viewed, want) {
			t.Errorf("%s: RegroupFrom without buf differs from the copy runs", c.name)
		}
		if !bytes.Equal(viewedDense, want) {
			t.Errorf("%s: RegroupFrom with buf differs from the copy runs", c.name)
		}
		if !bytes.Equal(viewedWoven, want) {
			t.Errorf("%s: RegroupFrom with Interleave differs from the copy runs", c.name)
		}
		if !bytes.Equal(wovenScratch, want) {
			t.Errorf("%s: Regroup with memcopy's streaming Interleave differs from the copy runs", c.name)
		}
		// The CPU order's K rows from two source blocks into one of twice
		// their size are pairs Interleave writes (among others).
		if twice := c.src.Order == kvmem.OrderCPU && c.dst.BlockSize == 2*c.src.BlockSize; twice && woven == 0 {
			t.Errorf("%s: Interleave wrote %d pairs", c.name, woven)
		}
		var fresh []byte
		x.Copy(src, func() []byte { fresh = fill(); return fresh }())
		if !bytes.Equal(fresh, want) {
			t.Errorf("%s: Transfer.Copy differs from the copy runs", c.name)
		}
	}
}

// TestRegroupShape pins the plan that makes the CPU order's regroup
// between block sizes 16 and 32 fast, which no result shows, in the HETERO
// bench's shape (8 KV heads of 128 bfloat16): the two source blocks' K
// runs of a head (32-byte halves of each 64-byte row of the destination
// block) are performed as pairs, as are their V runs; the destination
// block is one dense group, performed pair by pair (pairwise): each
// head's K rows interleaved by Out.Interleave where the platform streams,
// else assembled in an 8 KiB buffer (then moved with streaming stores by
// the puller), each V copy (4 KiB) moved straight.
func TestRegroupShape(t *testing.T) {
	cpu := func(bs uint32) kvmem.Layout {
		return kvmem.Layout{Layers: 1, Planes: 1, Blocks: 8, BlockSize: bs, TPSize: 1, Order: kvmem.OrderCPU, Heads: 8, HeadSize: 128, Dtype: "bfloat16",
			BlockBytes: 8 * 128 * 2 * uint64(bs) * 2}
	}
	tr, err := kvmem.Translate(cpu(16), cpu(32))
	if err != nil {
		t.Fatal(err)
	}
	groups, pairs, dense, pairwise := kvmem.RegroupShape(&tr.Full)
	if groups != 1 || pairs != 8*2 || dense != 1 || pairwise != 1 {
		t.Fatalf("full tile: %d groups, %d pairs, %d dense, %d pairwise; want 1 group (the destination block), %d pairs, dense and pairwise", groups, pairs, dense, pairwise, 8*2)
	}
	x, err := tr.ForPull([]uint32{0, 1, 2, 3}, []uint32{0, 1}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := x.RegroupBytes(), uint64(128*64); got != want {
		t.Fatalf("RegroupBytes %d, want a head's K rows (%d)", got, want)
	}
}
