package kvmem_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/kvfill"
)

// described is a described layout of a small model: 2 layers, heads KV
// heads of 4 elements, rank rank of tp, block size bs, in order.
func described(order string, heads, tp, rank, bs uint32, dtype string) kvmem.Layout {
	l := kvmem.Layout{Layers: 2, Planes: 2, Blocks: 16, BlockSize: bs, TPSize: tp, TPRank: rank, Order: order, Heads: heads, HeadSize: 4, Dtype: dtype}
	if order == kvmem.OrderCPU {
		l.Planes = 1
	}
	_, n := l.HeadRange()
	l.BlockBytes = uint64(n) * uint64(l.HeadSize) * uint64(kvmem.DtypeBytes(dtype)) * uint64(bs) * uint64(3-l.Planes)
	return l
}

// wide is l with heads of 64 elements.
func wide(l kvmem.Layout) kvmem.Layout {
	l.BlockBytes = l.BlockBytes / uint64(l.HeadSize) * 64
	l.HeadSize = 64
	return l
}

func TestDescribedLayoutValidate(t *testing.T) {
	if err := described(kvmem.OrderCPU, 4, 2, 1, 16, "bfloat16").Validate(); err != nil {
		t.Fatalf("valid CPU layout rejected: %v", err)
	}
	if err := described(kvmem.OrderNHD, 2, 4, 3, 16, "float16").Validate(); err != nil {
		t.Fatalf("valid layout with replicated heads rejected: %v", err)
	}
	bad := map[string]func(*kvmem.Layout){
		"rank":        func(l *kvmem.Layout) { l.TPRank = l.TPSize },
		"order":       func(l *kvmem.Layout) { l.Order = "nchw" },
		"planes":      func(l *kvmem.Layout) { l.Planes = 1 },
		"dtype":       func(l *kvmem.Layout) { l.Dtype = "float64" },
		"heads":       func(l *kvmem.Layout) { l.Heads = 0 },
		"head size":   func(l *kvmem.Layout) { l.HeadSize = 0 },
		"split":       func(l *kvmem.Layout) { l.Heads, l.TPSize, l.TPRank = 3, 2, 0 },
		"block bytes": func(l *kvmem.Layout) { l.BlockBytes++ },
		"half":        func(l *kvmem.Layout) { l.Order = "" },
		"model":       func(l *kvmem.Layout) { l.Model = strings.Repeat("m", 300) },
	}
	for name, mut := range bad {
		l := described(kvmem.OrderNHD, 4, 2, 0, 16, "float16")
		mut(&l)
		if err := l.Validate(); !errors.Is(err, kvmem.ErrBadLayout) {
			t.Errorf("%s: want kvmem.ErrBadLayout, got %v", name, err)
		}
	}
}

func TestHeadRange(t *testing.T) {
	cases := []struct{ heads, tp, rank, first, n uint32 }{
		{8, 1, 0, 0, 8}, {8, 2, 1, 4, 4}, {8, 4, 3, 6, 2}, {2, 4, 0, 0, 1}, {2, 4, 1, 0, 1}, {2, 4, 2, 1, 1}, {2, 4, 3, 1, 1},
	}
	for _, c := range cases {
		l := kvmem.Layout{Heads: c.heads, TPSize: c.tp, TPRank: c.rank}
		if f, n := l.HeadRange(); f != c.first || n != c.n {
			t.Errorf("%d heads, rank %d of %d: heads %d+%d, want %d+%d", c.heads, c.rank, c.tp, f, n, c.first, c.n)
		}
	}
}

// TestTranslateRefuses: what cannot be translated is refused with an error
// that names it.
func TestTranslateRefuses(t *testing.T) {
	base := described(kvmem.OrderNHD, 4, 1, 0, 16, "float16")
	cases := []struct {
		name string
		mut  func(*kvmem.Layout)
		want string
	}{
		{"model", func(l *kvmem.Layout) { l.Model = "other" }, "model"},
		{"layers", func(l *kvmem.Layout) { l.Layers = 3 }, "layers"},
		{"heads", func(l *kvmem.Layout) { *l = described(kvmem.OrderNHD, 8, 1, 0, 16, "float16") }, "KV heads"},
		{"head size", func(l *kvmem.Layout) { l.HeadSize, l.BlockBytes = 8, 2*l.BlockBytes }, "head_size"},
		{"dtype", func(l *kvmem.Layout) { l.Dtype = "bfloat16" }, "dtype float16 vs bfloat16"},
		{"undescribed tp", func(l *kvmem.Layout) {
			*l = kvmem.Layout{Layers: 2, Planes: 2, Blocks: 16, BlockBytes: 128, BlockSize: 16, TPSize: 2}
		}, "tp_size 1 vs 2"},
		{"undescribed block size", func(l *kvmem.Layout) {
			*l = kvmem.Layout{Layers: 2, Planes: 2, Blocks: 16, BlockBytes: 256, BlockSize: 32, TPSize: 1}
		}, "block_size 16 vs 32"},
		{"tile", func(l *kvmem.Layout) { *l = described(kvmem.OrderNHD, 4, 1, 0, 4099, "float16") }, "tiles"},
	}
	for _, c := range cases {
		src := base
		src.Model = "m"
		dst := base
		dst.Model = "m"
		c.mut(&dst)
		_, err := kvmem.Translate(src, dst)
		if !errors.Is(err, kvmem.ErrIncompatible) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want kvmem.ErrIncompatible naming %q, got %v", c.name, c.want, err)
		}
	}
	if _, err := kvmem.Translate(base, kvmem.Layout{}); !errors.Is(err, kvmem.ErrBadLayout) {
		t.Errorf("invalid reader layout: want kvmem.ErrBadLayout, got %v", err)
	}
}

// TestTranslationPieces pins what a few translations read: head ranges are
// one piece per block where the order keeps them together, per token where
// it does not, and the CPU order's transposed K regrouped is staged.
func TestTranslationPieces(t *testing.T) {
	cases := []struct {
		name       string
		src, dst   kvmem.Layout
		whole      bool
		staged     bool
		ranks      []uint32
		pieces     int
		pieceBytes uint64 // of the first piece
	}{
		{"same shape", described(kvmem.OrderNHD, 4, 2, 1, 16, "float16"), described(kvmem.OrderNHD, 4, 2, 1, 16, "float16"), true, false, []uint32{1}, 0, 0},
		// [16 tokens][2 heads][4] from each of two ranks into [16][4][4]:
		// one piece per token, rank and plane; of 32 bytes: staged.
		{"nhd tp2->1", described(kvmem.OrderNHD, 4, 2, 0, 16, "float32"), described(kvmem.OrderNHD, 4, 1, 0, 16, "float32"), false, true, []uint32{0, 1}, 2 * 2 * 16, 2 * 4 * 4},
		// the same with heads of 64 elements: pieces of 512 bytes, direct.
		{"nhd tp2->1 wide heads", wide(described(kvmem.OrderNHD, 4, 2, 0, 16, "float32")), wide(described(kvmem.OrderNHD, 4, 1, 0, 16, "float32")), false, false, []uint32{0, 1}, 2 * 2 * 16, 2 * 64 * 4},
		// [2 heads][16][4] into [4 heads][16][4]: half a block per rank and plane.
		{"hnd tp2->1", described(kvmem.OrderHND, 4, 2, 0, 16, "float32"), described(kvmem.OrderHND, 4, 1, 0, 16, "float32"), false, false, []uint32{0, 1}, 2 * 2, 2 * 16 * 4 * 4},
		{"hnd tp1->2 rank 1", described(kvmem.OrderHND, 4, 1, 0, 16, "float32"), described(kvmem.OrderHND, 4, 2, 1, 16, "float32"), false, false, []uint32{0}, 2, 2 * 16 * 4 * 4},
		// pages of 2 heads from each rank: one piece per rank.
		{"cpu tp2->1", described(kvmem.OrderCPU, 4, 2, 0, 16, "bfloat16"), described(kvmem.OrderCPU, 4, 1, 0, 16, "bfloat16"), false, false, []uint32{0, 1}, 2, 2 * 2 * 16 * 4 * 2},
		// token-major blocks of 16 into blocks of 32: each source block is
		// half a destination block.
		{"nhd bs16->32", described(kvmem.OrderNHD, 4, 1, 0, 16, "float16"), described(kvmem.OrderNHD, 4, 1, 0, 32, "float16"), false, false, []uint32{0}, 2 * 2, 16 * 4 * 4 * 2},
		// the transposed K moves 16 elements at a time: staged.
		{"cpu bs16->32", described(kvmem.OrderCPU, 4, 1, 0, 16, "bfloat16"), described(kvmem.OrderCPU, 4, 1, 0, 32, "bfloat16"), false, true, []uint32{0}, 0, 16 * 2},
	}
	for _, c := range cases {
		tr, err := kvmem.Translate(c.src, c.dst)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if tr.Whole != c.whole || tr.Staged != c.staged || fmt.Sprint(tr.Ranks) != fmt.Sprint(c.ranks) {
			t.Errorf("%s: whole=%v staged=%v ranks=%v, want %v %v %v", c.name, tr.Whole, tr.Staged, tr.Ranks, c.whole, c.staged, c.ranks)
		}
		if c.whole {
			continue
		}
		if c.pieces > 0 && len(tr.Full.Pieces) != c.pieces {
			t.Errorf("%s: %d pieces, want %d", c.name, len(tr.Full.Pieces), c.pieces)
		}
		if got := tr.Full.Pieces[0].Len; got != c.pieceBytes {
			t.Errorf("%s: first piece %d bytes, want %d", c.name, got, c.pieceBytes)
		}
	}
}

// runTransfer performs a pull in memory (Transfer.Copy), after checking
// that every read lies in one extent the hold registers (a run of its
// blocks in one layer and plane) and every write in the destination blocks.
func runTransfer(tr *kvmem.Translation, src [][]byte, dst []byte, srcIDs, dstIDs []uint32, numTokens uint32) (uint32, error) {
	x, err := tr.ForPull(srcIDs, dstIDs, numTokens)
	if err != nil {
		return 0, err
	}
	if !tr.Whole {
		srcExt, dstExt := tr.Src.Extents(srcIDs), tr.Dst.Extents(dstIDs)
		var bad error
		check := func(m kvmem.Move, direct bool) {
			if bad == nil && !inOne(srcExt, m.SrcOff, m.Len) {
				bad = fmt.Errorf("read [%d,+%d) of rank %d crosses or leaves the hold's extents", m.SrcOff, m.Len, m.Rank)
			}
			if bad == nil && direct && !inOne(dstExt, m.DstOff, m.Len) {
				bad = fmt.Errorf("write [%d,+%d) outside the destination blocks", m.DstOff, m.Len)
			}
		}
		if !tr.Staged {
			var direct, strided []kvmem.Move
			x.DirectMoves(func(m kvmem.Move) {
				check(m, true)
				direct = append(direct, m)
			})
			// The strided form is the same reads, grouped.
			x.StridedMoves(func(sm kvmem.StridedMove) {
				for i := range sm.Count {
					m := sm.Move
					m.SrcOff += uint64(i) * sm.SrcStride
					m.DstOff += uint64(i) * sm.DstStride
					if i > 0 && (m.SrcOff < sm.SrcOff || sm.SrcStride == 0) {
						bad = fmt.Errorf("strided move %+v does not advance", sm)
					}
					strided = append(strided, m)
				}
			})
			if bad == nil && fmt.Sprint(direct) != fmt.Sprint(strided) {
				bad = fmt.Errorf("strided moves (%d reads) differ from the direct ones (%d)", len(strided), len(direct))
			}
		} else {
			for layer := uint32(0); layer < tr.Src.Layers; layer++ {
				for k := range x.Tiles() {
					x.StagedReads(layer, k, func(m kvmem.Move) { check(m, false) })
					x.StagedCopies(layer, k, func(r kvmem.CopyRun, do uint64) {
						for i := range r.Count {
							at := do + uint64(i)*r.DstStride
							if bad == nil && !inOne(dstExt, at, r.Len) {
								bad = fmt.Errorf("copy [%d,+%d) outside the destination blocks", at, r.Len)
							}
						}
					})
				}
			}
		}
		if bad != nil {
			return 0, bad
		}
	}
	x.Copy(src, dst)
	return x.Tokens, nil
}

func inOne(exts []kvmem.Extent, off, n uint64) bool {
	for _, e := range exts {
		if off >= e.Off && off+n <= e.Off+e.Len {
			return true
		}
	}
	return false
}

// TestTranslateEveryShape moves KV between every pair of in-block orders,
// TP sizes 1, 2 and 4 (every reader rank; heads split and replicated),
// and block sizes, and checks every element of the reader's heads, token by
// token, and that nothing else was written.
func TestTranslateEveryShape(t *testing.T) {
	orders := []string{kvmem.OrderNHD, kvmem.OrderHND, kvmem.OrderCPU}
	tps := []uint32{1, 2, 4}
	sizes := [][2]uint32{{4, 4}, {4, 8}, {8, 4}, {4, 6}}
	srcIDs := []uint32{5, 6, 7, 2, 9, 10, 11, 0}
	runs := 0
	for _, heads := range []uint32{4, 2} {
		for _, so := range orders {
			for _, do := range orders {
				for _, stp := range tps {
					for _, dtp := range tps {
						for _, bs := range sizes {
							dtype := "float16"
							if (stp+dtp)%3 == 0 {
								dtype = "float32"
							}
							// A partial last block: tokens stop 3 slots short.
							numTokens := uint32(len(srcIDs))*bs[0] - 3
							src := make([][]byte, stp)
							sl := described(so, heads, stp, 0, bs[0], dtype)
							for r := range stp {
								l := described(so, heads, stp, r, bs[0], dtype)
								src[r] = make([]byte, l.Size())
								kvfill.Fill(l, src[r], srcIDs)
							}
							for dr := range dtp {
								dl := described(do, heads, dtp, dr, bs[1], dtype)
								dl.Blocks = 32
								name := fmt.Sprintf("heads %d %s tp%d bs%d -> %s tp%d rank %d bs%d %s", heads, so, stp, bs[0], do, dtp, dr, bs[1], dtype)
								tr, err := kvmem.Translate(sl, dl)
								if err != nil {
									t.Fatalf("%s: %v", name, err)
								}
								_, nDst, err := kvmem.PullSize(bs[0], len(srcIDs), numTokens, bs[1])
								if err != nil {
									t.Fatalf("%s: %v", name, err)
								}
								dstIDs := make([]uint32, nDst)
								for i := range dstIDs {
									dstIDs[i] = uint32(31 - 3*i%32) // scattered
								}
								dst := make([]byte, dl.Size())
								tokens, err := runTransfer(tr, src, dst, srcIDs, dstIDs, numTokens)
								if err != nil {
									t.Fatalf("%s: %v", name, err)
								}
								if err := kvfill.Check(dl, dst, dstIDs, tokens, true); err != nil {
									t.Fatalf("%s (whole=%v staged=%v): %v", name, tr.Whole, tr.Staged, err)
								}
								runs++
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d pulls verified", runs)
}

func TestPullSize(t *testing.T) {
	cases := []struct {
		sbs          uint32
		n            int
		num, dbs     uint32
		tokens       uint32
		nDst         int
		errSubstring string
	}{
		{16, 4, 50, 16, 64, 4, ""},  // equal block sizes: whole blocks
		{16, 4, 50, 32, 50, 2, ""},  // regrouped: what 50 tokens need
		{16, 4, 0, 8, 64, 8, ""},    // every slot
		{16, 4, 65, 32, 0, 0, "65"}, // more tokens than the blocks hold
		{16, 0, 0, 16, 0, 0, "0 remote blocks"},
	}
	for _, c := range cases {
		tokens, nDst, err := kvmem.PullSize(c.sbs, c.n, c.num, c.dbs)
		if c.errSubstring != "" {
			if !errors.Is(err, kvmem.ErrBadBlockIDs) || !strings.Contains(err.Error(), c.errSubstring) {
				t.Errorf("%+v: want kvmem.ErrBadBlockIDs naming %q, got %v", c, c.errSubstring, err)
			}
			continue
		}
		if err != nil || tokens != c.tokens || nDst != c.nDst {
			t.Errorf("%+v: got %d tokens into %d blocks, %v", c, tokens, nDst, err)
		}
	}
}

// TestElementAt pins each in-block order against its definition (a block
// of 16 slots, 2 local heads of 4 float16 elements).
func TestElementAt(t *testing.T) {
	const bs, d, e = 16, 4, 2
	cases := []struct {
		order            string
		kv, slot, h, dim uint32
		plane            uint32
		off              uint64
	}{
		// (2, blocks, block_size, heads, head_size): [slot][head][dim] per plane.
		{kvmem.OrderNHD, 1, 3, 1, 2, 1, ((3*2+1)*d + 2) * e},
		// [head][slot][dim] per plane.
		{kvmem.OrderHND, 0, 3, 1, 2, 0, ((1*bs+3)*d + 2) * e},
		// one page of 2*bs*d per head: K transposed [dim][slot] ...
		{kvmem.OrderCPU, 0, 3, 1, 2, 0, (1*2*bs*d + 2*bs + 3) * e},
		// ... then V [slot][dim].
		{kvmem.OrderCPU, 1, 3, 1, 2, 0, (1*2*bs*d + bs*d + 3*d + 2) * e},
	}
	for _, c := range cases {
		l := described(c.order, 4, 2, 0, bs, "float16")
		if p, off := l.ElementAt(c.kv, c.slot, c.h, c.dim); p != c.plane || off != c.off {
			t.Errorf("%s kv %d slot %d head %d dim %d: plane %d offset %d, want %d %d", c.order, c.kv, c.slot, c.h, c.dim, p, off, c.plane, c.off)
		}
	}
}

// TestStridedMovesGroupHeadRanges: between NHD engines of TP 2 and 1, a
// rank's heads are a piece per token; grouped, they are one strided move
// per holder rank, plane and block, of a piece per token at the block's
// token stride.
func TestStridedMovesGroupHeadRanges(t *testing.T) {
	src, dst := wide(described(kvmem.OrderNHD, 4, 2, 0, 16, "float32")), wide(described(kvmem.OrderNHD, 4, 1, 0, 16, "float32"))
	tr, err := kvmem.Translate(src, dst)
	if err != nil || tr.Staged {
		t.Fatalf("translation: %+v %v", tr, err)
	}
	srcIDs, dstIDs := []uint32{3, 4, 9}, []uint32{0, 7, 2}
	x, err := tr.ForPull(srcIDs, dstIDs, 0)
	if err != nil {
		t.Fatal(err)
	}
	var moves []kvmem.StridedMove
	x.StridedMoves(func(m kvmem.StridedMove) { moves = append(moves, m) })
	if want := 2 * 2 * 2 * len(srcIDs); len(moves) != want { // layers × planes × ranks × blocks
		t.Fatalf("%d strided moves, want %d", len(moves), want)
	}
	piece := uint64(2 * 64 * 4) // two heads of 64 float32
	for _, m := range moves {
		if m.Count != 16 || m.Len != piece || m.SrcStride != piece || m.DstStride != 2*piece {
			t.Fatalf("strided move %+v: want 16 reads of %d bytes, source stride %d, destination stride %d", m, piece, piece, 2*piece)
		}
	}
}

// TestStagedCopiesRunAtStrides: the CPU order's transposed K regrouped
// into blocks of another size is a piece per head dimension and source
// block; in scratch order they run at constant strides, one run per head,
// K or V, and source block.
func TestStagedCopiesRunAtStrides(t *testing.T) {
	tr, err := kvmem.Translate(described(kvmem.OrderCPU, 4, 1, 0, 16, "bfloat16"), described(kvmem.OrderCPU, 4, 1, 0, 32, "bfloat16"))
	if err != nil || !tr.Staged {
		t.Fatalf("%+v %v", tr, err)
	}
	if n, want := len(tr.Full.Copies), 4*2*2; n > want { // heads × K,V × source blocks
		t.Fatalf("%d copy runs for %d pieces, want at most %d", n, len(tr.Full.Pieces), want)
	}
	var pieces int
	for _, r := range tr.Full.Copies {
		pieces += r.Count
	}
	if pieces != len(tr.Full.Pieces) {
		t.Fatalf("copy runs hold %d pieces, the tile has %d", pieces, len(tr.Full.Pieces))
	}
}
