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

// Regroup performs the copies of tile k of layer layer of a staged
// transfer (StagedCopies) into dst, the destination region, from scratch,
// the tile's once its reads have landed. Two runs of which one fills the
// gaps the other leaves in the destination (the CPU order's K from two
// source blocks of 16 tokens into one of 32: each a 32-byte half of every
// 64-byte row) are performed together, a row at a time, so that each
// destination line is written whole at once. Where the tile's copies into
// one destination block and plane write a range of it whole (dense: the
// whole tiles of the CPU order's pulls between block sizes), and buf holds
// the range (RegroupBytes), they are performed into buf and the range then
// moved to dst with out: a copy with streaming stores there writes the
// destination without first reading each line into the cache (a third of
// the memory traffic of plain stores). With out nil every copy goes
// straight to dst.
func (x *Transfer) Regroup(layer uint32, k int, dst, scratch, buf []byte, out func(dst, src []byte)) {
	t, tp := x.T, x.tile(k)
	for _, g := range tp.regroup {
		base := t.Dst.Offset(layer, g.plane, x.DstIDs[k*int(t.DstBlocks)+int(g.block)])
		if n := g.hi - g.lo; g.dense && out != nil && n <= uint64(len(buf)) {
			g.perform(tp.Copies, buf[:n], 0, g.lo, scratch)
			out(dst[base+g.lo:base+g.hi], buf[:n])
			continue
		}
		g.perform(tp.Copies, dst, base, 0, scratch)
	}
}

// RegroupBytes is the buf Regroup wants: the largest dense range a tile
// writes in one destination block and plane (0 when none is dense).
func (x *Transfer) RegroupBytes() uint64 {
	var n uint64
	for _, tp := range []*TilePlan{&x.T.Full, &x.last} {
		for _, g := range tp.regroup {
			if g.dense {
				n = max(n, g.hi-g.lo)
			}
		}
	}
	return n
}

// regroupGroup is the copy runs of a staged tile into one destination
// block and plane (in scratch order, paired), which write [lo, hi) of it:
// every byte of it where dense.
type regroupGroup struct {
	block, plane uint32
	lo, hi       uint64
	written      uint64 // bytes the copies write
	dense        bool
	pairs        []runPair
}

// perform does the group's copies into dst, where the destination block
// starts at base; offsets within the block less sub.
func (g *regroupGroup) perform(runs []CopyRun, dst []byte, base, sub uint64, scratch []byte) {
	for _, pr := range g.pairs {
		r := runs[pr.a]
		if pr.b < 0 {
			r.CopyOut(dst, base+r.DstOff-sub, scratch)
		} else {
			copyOutPair(r, runs[pr.b].Scratch, dst, base+r.DstOff-sub, scratch)
		}
	}
}

// runPair is a copy run of a staged tile (Copies[a]) and, unless b < 0,
// the run Copies[b] whose copy i lands right after a's copy i.
type runPair struct{ a, b int }

// regroupPlan groups runs (a tile's Copies, in scratch order) by
// destination block and plane, pairing each run with the later one that
// fills its gaps in the destination where there is one (that run then goes
// with it, not in its own place): the same block, plane, length, count and
// strides, copy i starting where its copy i ends.
func regroupPlan(runs []CopyRun) []regroupGroup {
	type at struct {
		block, plane uint32
		off          uint64
	}
	starts := make(map[at]int, len(runs))
	for i, r := range runs {
		starts[at{r.DstBlock, r.DstPlane, r.DstOff}] = i
	}
	taken := make([]bool, len(runs))
	type key struct{ block, plane uint32 }
	index := map[key]int{}
	var out []regroupGroup
	for i, r := range runs {
		if taken[i] {
			continue
		}
		pr, ways := runPair{a: i, b: -1}, uint64(1)
		if j, ok := starts[at{r.DstBlock, r.DstPlane, r.DstOff + r.Len}]; ok && j > i && !taken[j] {
			q := runs[j]
			if q.Len == r.Len && q.Count == r.Count && q.ScratchStride == r.ScratchStride && q.DstStride == r.DstStride &&
				(r.Count == 1 || r.DstStride >= 2*r.Len) {
				pr.b, taken[j], ways = j, true, 2
			}
		}
		gi, ok := index[key{r.DstBlock, r.DstPlane}]
		if !ok {
			gi = len(out)
			index[key{r.DstBlock, r.DstPlane}] = gi
			out = append(out, regroupGroup{block: r.DstBlock, plane: r.DstPlane, lo: r.DstOff})
		}
		g := &out[gi]
		g.pairs = append(g.pairs, pr)
		g.lo = min(g.lo, r.DstOff)
		g.hi = max(g.hi, r.DstOff+uint64(r.Count-1)*r.DstStride+ways*r.Len)
		g.written += uint64(r.Count) * ways * r.Len
	}
	for i := range out {
		// The pieces of a translation never overlap in the destination
		// (each element is written once): as many bytes as the range is
		// wide fill it.
		out[i].dense = out[i].written == out[i].hi-out[i].lo
	}
	return out
}

// copyOutPair performs run r and the run that fills its gaps (the same
// but for its first copy's place in the scratch, scratch2, and in the
// destination, right after r's), copy i of each in turn.
func copyOutPair(r CopyRun, scratch2 uint64, dst []byte, dstOff uint64, scratch []byte) {
	s, s2, d, n := r.Scratch, scratch2, dstOff, r.Len
	switch n {
	case 16:
		for range r.Count {
			a, b := *(*[16]byte)(scratch[s:]), *(*[16]byte)(scratch[s2:]) // through values: a copy between two slices is a memmove call
			o := (*[32]byte)(dst[d:])
			*(*[16]byte)(o[:16]) = a
			*(*[16]byte)(o[16:]) = b
			s, s2, d = s+r.ScratchStride, s2+r.ScratchStride, d+r.DstStride
		}
	case 32:
		for range r.Count {
			a, b := *(*[32]byte)(scratch[s:]), *(*[32]byte)(scratch[s2:])
			o := (*[64]byte)(dst[d:])
			*(*[32]byte)(o[:32]) = a
			*(*[32]byte)(o[32:]) = b
			s, s2, d = s+r.ScratchStride, s2+r.ScratchStride, d+r.DstStride
		}
	default:
		for range r.Count {
			copy(dst[d:d+n], scratch[s:s+n])
			copy(dst[d+n:d+2*n], scratch[s2:s2+n])
			s, s2, d = s+r.ScratchStride, s2+r.ScratchStride, d+r.DstStride
		}
	}
}

// CopyOut performs run into dst (the destination region) at dstOff, from
// scratch (the tile's).
func (r CopyRun) CopyOut(dst []byte, dstOff uint64, scratch []byte) {
	s, d, n := r.Scratch, dstOff, r.Len
	// The pieces of a staged tile are small (a row of a head's K in vLLM's
	// CPU order: block_size elements, 32 bytes of bfloat16 at 16 tokens),
	// so a copy call's own cost would be most of the regroup: pieces of 8,
	// 16, 32 and 64 bytes are moved as arrays (a few vector moves each).
	switch n {
	case 8:
		for range r.Count {
			v := *(*[8]byte)(scratch[s:]) // through a value: a copy between two slices is a memmove call
			*(*[8]byte)(dst[d:]) = v
			s, d = s+r.ScratchStride, d+r.DstStride
		}
	case 16:
		for range r.Count {
			v := *(*[16]byte)(scratch[s:]) // through a value: a copy between two slices is a memmove call
			*(*[16]byte)(dst[d:]) = v
			s, d = s+r.ScratchStride, d+r.DstStride
		}
	case 32:
		for range r.Count {
			v := *(*[32]byte)(scratch[s:]) // through a value: a copy between two slices is a memmove call
			*(*[32]byte)(dst[d:]) = v
			s, d = s+r.ScratchStride, d+r.DstStride
		}
	case 64:
		for range r.Count {
			v := *(*[64]byte)(scratch[s:]) // through a value: a copy between two slices is a memmove call
			*(*[64]byte)(dst[d:]) = v
			s, d = s+r.ScratchStride, d+r.DstStride
		}
	default:
		for range r.Count {
			copy(dst[d:d+n], scratch[s:s+n])
			s, d = s+r.ScratchStride, d+r.DstStride
		}
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
			x.Regroup(layer, k, dst, scratch, buf, func(d, s []byte) { copy(d, s) })
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
