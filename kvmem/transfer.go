package kvmem

import (
	"fmt"
	"slices"
)

// Transfer is one pull under a translation that is not Whole: tokens of
// KV from the hold's blocks SrcIDs (in the hold's order) into the
// destination blocks DstIDs.
type Transfer struct {
	T              *Translation
	SrcIDs, DstIDs []uint32
	Tokens         uint32
	tiles          int
	last           TilePlan // the last tile's plan (Full, or a Part)
}

// ForPull checks a pull's block lists against the translation (PullSize:
// numTokens tokens of the hold, 0 for every slot of its blocks) and returns
// its Transfer. Errors wrap ErrBadBlockIDs.
func (t *Translation) ForPull(srcIDs, dstIDs []uint32, numTokens uint32) (*Transfer, error) {
	tokens, nDst, err := PullSize(t.Src.BlockSize, len(srcIDs), numTokens, t.Dst.BlockSize)
	if err != nil {
		return nil, err
	}
	if len(dstIDs) != nDst {
		return nil, fmt.Errorf("%w: %d destination blocks for %d tokens in blocks of %d (want %d)", ErrBadBlockIDs, len(dstIDs), tokens, t.Dst.BlockSize, nDst)
	}
	x := &Transfer{T: t, SrcIDs: srcIDs, DstIDs: dstIDs, Tokens: tokens}
	if !t.Whole {
		x.tiles = int((uint64(tokens) + uint64(t.Tile) - 1) / uint64(t.Tile))
		x.last = t.Part(tokens - uint32(x.tiles-1)*t.Tile)
	}
	return x, nil
}

// MaxMoves bounds how many reads DirectMoves makes (one per piece of
// every tile and layer, before joining).
func (x *Transfer) MaxMoves() int {
	return int(x.T.Src.Layers) * ((x.tiles-1)*len(x.T.Full.Pieces) + len(x.last.Pieces))
}

// Tiles is how many tiles the transfer spans (in every layer).
func (x *Transfer) Tiles() int { return x.tiles }

// tile is the plan of tile k.
func (x *Transfer) tile(k int) *TilePlan {
	if k == x.tiles-1 {
		return &x.last
	}
	return &x.T.Full
}

// Move is one contiguous read of a translated pull, in region terms: Len
// bytes of holder rank Rank's region at SrcOff, inside layer Layer and
// plane Plane, starting in the block at position SrcPos of the hold's
// block list; to DstOff of the destination region (or of the tile's
// scratch, for a staged tile's reads).
type Move struct {
	Rank, Layer, Plane uint32
	SrcPos             int
	SrcOff, DstOff     uint64
	Len                uint64
	// DstPos is the position in the destination block list of the block
	// the read starts writing in (direct moves).
	DstPos int
}

// DirectMoves calls f with every read of a direct (not staged) transfer, in
// order: layer by layer, lane by lane, tile by tile. Reads that continue
// each other on both sides, within one run of the hold's list (one
// registered extent), are joined.
func (x *Transfer) DirectMoves(f func(Move)) {
	t := x.T
	src, dst := t.Src, t.Dst
	var cur Move
	have := false
	j := joiner{ids: x.SrcIDs}
	emit := func(m Move) {
		if have && j.join(&cur, m) {
			return
		}
		if have {
			f(cur)
		}
		cur, have, j.lastPos = m, true, m.SrcPos
	}
	for layer := uint32(0); layer < src.Layers; layer++ {
		for lo := 0; lo < len(t.Full.Pieces); {
			hi := lo + 1
			for hi < len(t.Full.Pieces) && sameLane(t.Full.Pieces[lo], t.Full.Pieces[hi]) {
				hi++
			}
			for k := 0; k < x.tiles; k++ {
				pieces := t.Full.Pieces[lo:hi]
				if k == x.tiles-1 {
					pieces = laneOf(x.last.Pieces, t.Full.Pieces[lo])
				}
				for _, p := range pieces {
					sp := k*int(t.SrcBlocks) + int(p.SrcBlock)
					dp := k*int(t.DstBlocks) + int(p.DstBlock)
					emit(Move{
						Rank: p.SrcRank, Layer: layer, Plane: p.SrcPlane, SrcPos: sp, DstPos: dp,
						SrcOff: src.Offset(layer, p.SrcPlane, x.SrcIDs[sp]) + p.SrcOff,
						DstOff: dst.Offset(layer, p.DstPlane, x.DstIDs[dp]) + p.DstOff, Len: p.Len,
					})
				}
			}
			lo = hi
		}
	}
	if have {
		f(cur)
	}
}

// joiner joins reads that continue each other into one, as long as they
// stay in one run of the hold's list ids (one registered extent).
type joiner struct {
	ids     []uint32
	lastPos int // the position of the block the current read ends in
}

// join extends cur by m and reports true when m continues cur on both
// sides, in the same block or at the start of the next one of the same run
// (next position, next id).
func (j *joiner) join(cur *Move, m Move) bool {
	if cur.Rank != m.Rank || cur.Layer != m.Layer || cur.Plane != m.Plane ||
		cur.SrcOff+cur.Len != m.SrcOff || cur.DstOff+cur.Len != m.DstOff ||
		!(m.SrcPos == j.lastPos || m.SrcPos == j.lastPos+1 && j.ids[m.SrcPos] == j.ids[j.lastPos]+1) {
		return false
	}
	cur.Len += m.Len
	j.lastPos = m.SrcPos
	return true
}

func sameLane(a, b Piece) bool {
	return a.DstPlane == b.DstPlane && a.SrcRank == b.SrcRank && a.SrcPlane == b.SrcPlane
}

// laneOf is the pieces of pieces in lane's lane (a contiguous group).
func laneOf(pieces []Piece, lane Piece) []Piece {
	lo := slices.IndexFunc(pieces, func(p Piece) bool { return sameLane(p, lane) })
	if lo < 0 {
		return nil
	}
	hi := lo
	for hi < len(pieces) && sameLane(pieces[hi], lane) {
		hi++
	}
	return pieces[lo:hi]
}

// StagedReads calls f with the reads of tile k of layer layer of a staged
// transfer; their DstOff is an offset into that tile's own scratch, whose
// size it returns.
func (x *Transfer) StagedReads(layer uint32, k int, f func(Move)) (scratch uint64) {
	t, tp := x.T, x.tile(k)
	for _, s := range tp.Spans {
		pos := k*int(t.SrcBlocks) + int(s.Block)
		f(Move{Rank: s.Rank, Layer: layer, Plane: s.Plane, SrcPos: pos,
			SrcOff: t.Src.Offset(layer, s.Plane, x.SrcIDs[pos]) + s.Off, DstOff: s.ScratchOff, Len: s.Len})
	}
	return tp.ScratchBytes
}

// StagedCopies calls f with the copies of tile k of layer layer of a
// staged transfer, once its reads have landed, as runs: run.Count copies of
// run.Len bytes from the tile's scratch at run.Scratch + i×ScratchStride to
// the destination region at dstOff + i×DstStride.
func (x *Transfer) StagedCopies(layer uint32, k int, f func(run CopyRun, dstOff uint64)) {
	t, tp := x.T, x.tile(k)
	for _, r := range tp.Copies {
		dp := k*int(t.DstBlocks) + int(r.DstBlock)
		f(r, t.Dst.Offset(layer, r.DstPlane, x.DstIDs[dp])+r.DstOff)
	}
}

// CheckPull is Translate's early word at pull.start, before the holder's
// layout is known: the transfer params name the holder's TP size and
// block size (0: not said), its nSrc blocks and numTokens tokens; the
// reader gives nDst blocks of its region laid out as dst. A reader whose
// layout does not describe its blocks takes only its own shape; the block
// counts must be what PullSize says.
func CheckPull(srcTP, srcBlockSize uint32, nSrc int, numTokens uint32, nDst int, dst Layout) error {
	if srcBlockSize == 0 {
		srcBlockSize = dst.BlockSize
	}
	if !dst.Described() {
		const why = "blocks move whole only: describe this engine's layout (kv_order, num_kv_heads, head_size, dtype) to translate"
		switch {
		case srcTP != 0 && srcTP != dst.TPSize:
			return fmt.Errorf("%w: the holder's tp_size is %d, this region's %d; %s", ErrIncompatible, srcTP, dst.TPSize, why)
		case srcBlockSize != dst.BlockSize:
			return fmt.Errorf("%w: the holder's block_size is %d, this region's %d; %s", ErrIncompatible, srcBlockSize, dst.BlockSize, why)
		}
	}
	_, want, err := PullSize(srcBlockSize, nSrc, numTokens, dst.BlockSize)
	if err != nil {
		return err
	}
	if nDst != want {
		return fmt.Errorf("%w: %d destination blocks for %d remote blocks of %d tokens (want %d blocks of %d)", ErrBadBlockIDs, nDst, nSrc, srcBlockSize, want, dst.BlockSize)
	}
	return nil
}

// TileScratch is the scratch tile k of a staged transfer reads into.
func (x *Transfer) TileScratch(k int) uint64 { return x.tile(k).ScratchBytes }

// Bytes is what the transfer writes into the destination: every K and V
// vector of the reader rank's heads for each of its tokens, in every layer.
func (x *Transfer) Bytes() uint64 {
	d := x.T.Dst
	if x.T.Whole {
		return uint64(len(x.DstIDs)) * uint64(d.Layers) * uint64(d.Planes) * d.BlockBytes
	}
	_, hn := d.HeadRange()
	return uint64(x.Tokens) * uint64(hn) * uint64(d.HeadSize) * uint64(DtypeBytes(d.Dtype)) * 2 * uint64(d.Layers)
}

// Copy performs the transfer between memory of this process: src holds
// the holder's regions by rank, dst the destination region. Whole blocks
// from the destination's rank, direct moves, or staged tiles through a
// scratch of one tile. For tests and simulated engines; connexd's puller
// reads over the data plane instead.
func (x *Transfer) Copy(src [][]byte, dst []byte) {
	t := x.T
	if t.Whole {
		l, d := t.Src, t.Dst
		for layer := uint32(0); layer < l.Layers; layer++ {
			for p := uint32(0); p < l.Planes; p++ {
				for i := range x.SrcIDs {
					s, o := l.Offset(layer, p, x.SrcIDs[i]), d.Offset(layer, p, x.DstIDs[i])
					copy(dst[o:o+l.BlockBytes], src[d.TPRank][s:s+l.BlockBytes])
				}
			}
		}
		return
	}
	if !t.Staged {
		x.DirectMoves(func(m Move) { copy(dst[m.DstOff:m.DstOff+m.Len], src[m.Rank][m.SrcOff:m.SrcOff+m.Len]) })
		return
	}
	var scratch []byte
	buf := make([]byte, x.RegroupBytes()) // Regroup's dense path, as the puller's
	for layer := uint32(0); layer < t.Src.Layers; layer++ {
		for k := range x.Tiles() {
			if n := x.TileScratch(k); uint64(len(scratch)) < n {
				scratch = make([]byte, n)
			}
			x.StagedReads(layer, k, func(m Move) { copy(scratch[m.DstOff:m.DstOff+m.Len], src[m.Rank][m.SrcOff:m.SrcOff+m.Len]) })
			x.Regroup(layer, k, dst, scratch, buf, Out{Copy: func(d, s []byte) { copy(d, s) }})
		}
	}
}

// StridedMove is Count reads of Len bytes from one block of a holder rank
// into one destination block: read i from SrcOff + i×SrcStride into DstOff
// + i×DstStride. A head range of a token-major (nhd) block is one: a piece
// per token at the block's token stride. Its reads start in the block at
// position SrcPos of the hold's list (one registered extent) and write in
// the destination block at DstPos.
type StridedMove struct {
	Move                        // the first read (Len is every read's)
	Count                int    // reads, ≥ 1
	SrcStride, DstStride uint64 // between reads; 0 when Count is 1
}

// StridedMoves calls f with the reads of DirectMoves, in the same order,
// grouped into strided moves: the runs of pieces of each tile (pieces of
// one source block and one destination block, of one length, at constant
// strides: planned once per translation), and single pieces joined where
// they continue each other as DirectMoves joins them. A pull between NHD
// engines of TP 2 and 1 is one move per holder rank, plane, layer and
// block, not one per token.
func (x *Transfer) StridedMoves(f func(StridedMove)) {
	t := x.T
	src, dst := t.Src, t.Dst
	var cur StridedMove
	have := false
	j := joiner{ids: x.SrcIDs}
	emit := func(m StridedMove) {
		if have && cur.Count == 1 && m.Count == 1 && j.join(&cur.Move, m.Move) {
			return
		}
		if have {
			f(cur)
		}
		cur, have, j.lastPos = m, true, m.SrcPos
	}
	for layer := uint32(0); layer < src.Layers; layer++ {
		for li, lane := range t.Full.lanes {
			key := t.Full.Pieces[lane.lo]
			for k := 0; k < x.tiles; k++ {
				tp, lr := x.tile(k), lane
				if k == x.tiles-1 {
					var ok bool
					if lr, ok = tp.lane(li, key); !ok {
						continue
					}
				}
				for _, r := range lr.runs {
					p := tp.Pieces[r.first]
					sp := k*int(t.SrcBlocks) + int(p.SrcBlock)
					dp := k*int(t.DstBlocks) + int(p.DstBlock)
					emit(StridedMove{
						Move: Move{Rank: p.SrcRank, Layer: layer, Plane: p.SrcPlane, SrcPos: sp, DstPos: dp,
							SrcOff: src.Offset(layer, p.SrcPlane, x.SrcIDs[sp]) + p.SrcOff,
							DstOff: dst.Offset(layer, p.DstPlane, x.DstIDs[dp]) + p.DstOff, Len: p.Len},
						Count: r.count, SrcStride: r.srcStride, DstStride: r.dstStride,
					})
				}
			}
		}
	}
	if have {
		f(cur)
	}
}

// lane is the plan's lane of the same source rank and planes as key (the
// full tile's lane li): at index li when the plan has the same lanes.
func (tp *TilePlan) lane(li int, key Piece) (laneRuns, bool) {
	if li < len(tp.lanes) && sameLane(tp.Pieces[tp.lanes[li].lo], key) {
		return tp.lanes[li], true
	}
	for _, l := range tp.lanes {
		if sameLane(tp.Pieces[l.lo], key) {
			return l, true
		}
	}
	return laneRuns{}, false
}
