package kvmem

import (
	"cmp"
	"fmt"
	"slices"
)

// MinDirectBytes is the smallest average piece a translation reads
// straight into the destination. Below it (the CPU order's transposed K
// regrouped into other block sizes moves a few elements at a time) one
// one-sided read per piece costs more than the bytes: the translation is
// staged instead, whole source spans read into scratch memory and the
// pieces copied out of it on arrival.
const MinDirectBytes = 256

// maxTileUnits bounds the work of planning one tile (its vectors, or its
// elements where a layout transposes them), so that an odd pair of block
// sizes cannot make a pull plan for seconds.
const maxTileUnits = 1 << 21

// Translation says how a pull moves a prompt's KV from a holder's ranks
// (laid out as Src, rank 0's layout: every rank of an engine has the same
// shape) into one reader rank laid out as Dst. It is made by Translate, the
// one place that decides whether two layouts exchange KV and how.
type Translation struct {
	Src, Dst Layout
	// Whole: the same shape on both sides; block i of the holder's rank
	// Dst.TPRank goes whole into destination block i (the homogeneous
	// pull: one read per run of blocks in every layer and plane).
	Whole bool
	// Otherwise the pull is cut into tiles of Tile tokens (the least
	// common multiple of the block sizes): SrcBlocks holder blocks and
	// DstBlocks destination blocks each, all tiles alike but the last.
	Tile                 uint32
	SrcBlocks, DstBlocks uint32
	// Ranks are the holder ranks the reader's heads come from, ascending.
	Ranks []uint32
	// Staged: pieces too small to read one by one (MinDirectBytes); each
	// tile's spans are read into scratch and its pieces copied from there.
	Staged bool
	// Full is the plan of one whole tile, in every layer alike.
	Full TilePlan
}

// TilePlan is how one tile of a pull moves, in one layer (every layer
// moves alike, at its own offsets).
type TilePlan struct {
	Tokens uint32  // tokens the tile carries: Translation.Tile, or fewer in the last
	Pieces []Piece // grouped by lane (DstPlane, SrcRank, SrcPlane), then in destination order
	// Spans, for a staged translation: what the tile reads into scratch,
	// ScratchBytes in all; each piece then copies from Piece.Scratch.
	Spans        []Span
	ScratchBytes uint64
	// lanes are the pieces' lanes, each as runs of pieces at constant
	// strides within one source and one destination block (a head range
	// of an nhd block: a piece per token), for StridedMoves.
	lanes []laneRuns
	// Copies are the pieces of a staged tile as runs at constant strides
	// (the CPU order's transposed K regrouped: a head's dimensions, one
	// piece each), in scratch order: what the puller copies on arrival.
	Copies []CopyRun
}

// laneRuns is one lane of a tile plan: its pieces Pieces[lo:hi] as runs.
type laneRuns struct {
	lo, hi int
	runs   []pieceRun
}

// pieceRun is Count pieces from Pieces[First], each SrcStride and DstStride
// further than the one before.
type pieceRun struct {
	first, count         int
	srcStride, dstStride uint64
}

// laneRunsOf cuts pieces (in lane order) into lanes and each lane into
// runs: consecutive pieces of one source block and one destination block,
// of one length, at constant positive strides on both sides.
func laneRunsOf(pieces []Piece) []laneRuns {
	var out []laneRuns
	for lo := 0; lo < len(pieces); {
		hi := lo + 1
		for hi < len(pieces) && sameLane(pieces[lo], pieces[hi]) {
			hi++
		}
		l := laneRuns{lo: lo, hi: hi}
		for i := lo; i < hi; i++ {
			p := pieces[i]
			if n := len(l.runs); n > 0 {
				r := &l.runs[n-1]
				q := pieces[r.first+r.count-1]
				if q.SrcBlock == p.SrcBlock && q.DstBlock == p.DstBlock && q.Len == p.Len && p.SrcOff > q.SrcOff && p.DstOff > q.DstOff &&
					(r.count == 1 || p.SrcOff-q.SrcOff == r.srcStride && p.DstOff-q.DstOff == r.dstStride) {
					r.srcStride, r.dstStride = p.SrcOff-q.SrcOff, p.DstOff-q.DstOff
					r.count++
					continue
				}
			}
			l.runs = append(l.runs, pieceRun{first: i, count: 1})
		}
		out = append(out, l)
		lo = hi
	}
	return out
}

// CopyRun is Count copies of Len bytes from a staged tile's scratch into
// one destination block: copy i from Scratch + i×ScratchStride to DstOff +
// i×DstStride of the block DstBlock (within the tile) of plane DstPlane.
type CopyRun struct {
	DstBlock, DstPlane       uint32
	Scratch, DstOff, Len     uint64
	Count                    int
	ScratchStride, DstStride uint64
}

// Piece is one contiguous move: Len bytes at SrcOff in the block of holder
// rank SrcRank, plane SrcPlane, to DstOff in the destination block of plane
// DstPlane. Blocks count within the tile (SrcBlock < SrcBlocks), offsets
// within a block of one layer and plane.
type Piece struct {
	SrcRank, SrcBlock, SrcPlane uint32
	DstBlock, DstPlane          uint32
	SrcOff, DstOff, Len         uint64
	Scratch                     uint64 // staged: where the bytes are in the tile's scratch
}

// Span is one read of a staged tile: bytes [Off, Off+Len) of holder rank
// Rank's block Block (within the tile) in plane Plane, into the tile's
// scratch at ScratchOff.
type Span struct {
	Rank, Block, Plane   uint32
	Off, Len, ScratchOff uint64
}

// Compatible decides whether KV laid out as src (a holder's rank 0) can be
// moved into the reader rank laid out as dst, and whether whole blocks
// move (the same shape on both sides) or the KV is translated. It refuses,
// with an error wrapping ErrIncompatible that names what differs, KV of
// another model (name, layers, KV heads, head size), another dtype (KV is
// moved, never converted), and anything but whole blocks between equal
// shapes when either layout does not describe its blocks
// (Layout.Described). Different TP sizes and ranks, block sizes and
// in-block orders translate. This is the one place that decides; Translate
// plans what it allows.
func Compatible(src, dst Layout) (whole bool, err error) {
	if err := src.Validate(); err != nil {
		return false, fmt.Errorf("holder's layout: %w", err)
	}
	if err := dst.Validate(); err != nil {
		return false, fmt.Errorf("reader's layout: %w", err)
	}
	switch {
	case src.Model != "" && dst.Model != "" && src.Model != dst.Model:
		return false, fmt.Errorf("%w: model %q vs %q: one model's KV means nothing to another", ErrIncompatible, src.Model, dst.Model)
	case src.Layers != dst.Layers:
		return false, fmt.Errorf("%w: %d layers vs %d (another model)", ErrIncompatible, src.Layers, dst.Layers)
	}
	if !src.Described() || !dst.Described() {
		return true, wholeOnly(src, dst)
	}
	switch {
	case src.Heads != dst.Heads:
		return false, fmt.Errorf("%w: %d KV heads vs %d (another model)", ErrIncompatible, src.Heads, dst.Heads)
	case src.HeadSize != dst.HeadSize:
		return false, fmt.Errorf("%w: head_size %d vs %d (another model)", ErrIncompatible, src.HeadSize, dst.HeadSize)
	case src.Dtype != dst.Dtype:
		return false, fmt.Errorf("%w: dtype %s vs %s (KV is moved, never converted)", ErrIncompatible, src.Dtype, dst.Dtype)
	}
	if src.TPSize == dst.TPSize && src.BlockSize == dst.BlockSize && src.Order == dst.Order {
		return true, nil
	}
	tile := uint64(src.BlockSize) / gcd(src.BlockSize, dst.BlockSize) * uint64(dst.BlockSize)
	_, hn := dst.HeadRange()
	if units := 2 * tile * uint64(hn) * uint64(dst.HeadSize); units > maxTileUnits {
		return false, fmt.Errorf("%w: block sizes %d and %d regroup in tiles of %d tokens, too large to plan (%d elements)",
			ErrIncompatible, src.BlockSize, dst.BlockSize, tile, units)
	}
	return false, nil
}

// Translate plans how a pull moves KV from a holder laid out as src (its
// rank 0) into the reader rank laid out as dst, where Compatible allows
// it (its error otherwise).
func Translate(src, dst Layout) (*Translation, error) {
	whole, err := Compatible(src, dst)
	if err != nil {
		return nil, err
	}
	if whole {
		return &Translation{Src: src, Dst: dst, Whole: true, Ranks: []uint32{dst.TPRank}}, nil
	}
	tile := uint64(src.BlockSize) / gcd(src.BlockSize, dst.BlockSize) * uint64(dst.BlockSize)
	t := &Translation{Src: src, Dst: dst, Tile: uint32(tile), SrcBlocks: uint32(tile) / src.BlockSize, DstBlocks: uint32(tile) / dst.BlockSize}
	t.Full = t.plan(t.Tile)
	var bytes uint64
	for _, p := range t.Full.Pieces {
		bytes += p.Len
		if !slices.Contains(t.Ranks, p.SrcRank) {
			t.Ranks = append(t.Ranks, p.SrcRank)
		}
	}
	slices.Sort(t.Ranks)
	if bytes < MinDirectBytes*uint64(len(t.Full.Pieces)) {
		t.Staged = true
		t.Full.stage()
	}
	return t, nil
}

// wholeOnly is Compatible for layouts of which one does not say what its
// blocks hold: blocks move whole, between equal shapes only.
func wholeOnly(src, dst Layout) error {
	const why = "blocks move whole only: describe both layouts (kv_order, num_kv_heads, head_size, dtype) to translate"
	switch {
	case src.TPSize != dst.TPSize:
		return fmt.Errorf("%w: tp_size %d vs %d; %s", ErrIncompatible, src.TPSize, dst.TPSize, why)
	case src.BlockSize != dst.BlockSize:
		return fmt.Errorf("%w: block_size %d vs %d; %s", ErrIncompatible, src.BlockSize, dst.BlockSize, why)
	case src.Planes != dst.Planes:
		return fmt.Errorf("%w: %d planes vs %d; %s", ErrIncompatible, src.Planes, dst.Planes, why)
	case src.BlockBytes != dst.BlockBytes:
		return fmt.Errorf("%w: block_bytes %d vs %d; %s", ErrIncompatible, src.BlockBytes, dst.BlockBytes, why)
	}
	return nil
}

// Part is the plan of a last tile that carries only tokens (< Tile) tokens.
func (t *Translation) Part(tokens uint32) TilePlan {
	if tokens >= t.Tile {
		return t.Full
	}
	p := t.plan(tokens)
	if t.Staged {
		p.stage()
	}
	return p
}

// plan lists the moves of a tile of tokens tokens: every K and V vector of
// every head the reader rank holds, from the holder rank that holds it,
// joined into the longest pieces contiguous on both sides.
func (t *Translation) plan(tokens uint32) TilePlan {
	src, dst := t.Src, t.Dst
	e := uint64(DtypeBytes(src.Dtype))
	h0, hn := dst.HeadRange()
	var units []Piece
	for kv := uint32(0); kv < 2; kv++ {
		// A vector at a time where both sides keep its elements together,
		// else element by element.
		step := uint32(1)
		if src.dimsContiguous(kv) && dst.dimsContiguous(kv) {
			step = src.HeadSize
		}
		for tok := uint32(0); tok < tokens; tok++ {
			for h := h0; h < h0+hn; h++ {
				sl := src
				sl.TPRank = src.rankOf(h)
				sf, _ := sl.HeadRange()
				for d := uint32(0); d < src.HeadSize; d += step {
					sp, so := sl.ElementAt(kv, tok%src.BlockSize, h-sf, d)
					dp, do := dst.ElementAt(kv, tok%dst.BlockSize, h-h0, d)
					units = append(units, Piece{
						SrcRank: sl.TPRank, SrcBlock: tok / src.BlockSize, SrcPlane: sp, SrcOff: so,
						DstBlock: tok / dst.BlockSize, DstPlane: dp, DstOff: do, Len: uint64(step) * e,
					})
				}
			}
		}
	}
	slices.SortFunc(units, func(a, b Piece) int {
		return cmp.Or(cmp.Compare(a.DstPlane, b.DstPlane), cmp.Compare(a.SrcRank, b.SrcRank), cmp.Compare(a.SrcPlane, b.SrcPlane),
			cmp.Compare(a.DstBlock, b.DstBlock), cmp.Compare(a.DstOff, b.DstOff))
	})
	pieces := units[:0]
	for _, u := range units {
		if n := len(pieces); n > 0 && pieces[n-1].joins(u) {
			pieces[n-1].Len += u.Len
			continue
		}
		pieces = append(pieces, u)
	}
	tp := TilePlan{Tokens: tokens, Pieces: slices.Clip(pieces)}
	tp.lanes = laneRunsOf(tp.Pieces)
	return tp
}

// joins reports whether q continues p on both sides.
func (p Piece) joins(q Piece) bool {
	return p.SrcRank == q.SrcRank && p.SrcPlane == q.SrcPlane && p.SrcBlock == q.SrcBlock &&
		p.DstPlane == q.DstPlane && p.DstBlock == q.DstBlock &&
		p.SrcOff+p.Len == q.SrcOff && p.DstOff+p.Len == q.DstOff
}

// stage adds the spans a staged tile reads, one per holder rank, plane and
// block it touches (the bytes from its first piece's start to its last
// piece's end), and where each piece finds its bytes in the scratch.
func (tp *TilePlan) stage() {
	type key struct{ rank, plane, block uint32 }
	at := map[key]int{}
	for _, p := range tp.Pieces {
		k := key{p.SrcRank, p.SrcPlane, p.SrcBlock}
		i, ok := at[k]
		if !ok {
			at[k] = len(tp.Spans)
			tp.Spans = append(tp.Spans, Span{Rank: p.SrcRank, Block: p.SrcBlock, Plane: p.SrcPlane, Off: p.SrcOff, Len: p.Len})
			continue
		}
		s := &tp.Spans[i]
		end := max(s.Off+s.Len, p.SrcOff+p.Len)
		s.Off = min(s.Off, p.SrcOff)
		s.Len = end - s.Off
	}
	// Spans in source order, so that reads of consecutive blocks run on.
	order := make([]int, len(tp.Spans))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		x, y := tp.Spans[a], tp.Spans[b]
		return cmp.Or(cmp.Compare(x.Rank, y.Rank), cmp.Compare(x.Plane, y.Plane), cmp.Compare(x.Block, y.Block))
	})
	spans := make([]Span, len(order))
	for j, i := range order {
		spans[j] = tp.Spans[i]
		spans[j].ScratchOff = tp.ScratchBytes
		tp.ScratchBytes += spans[j].Len
		at[key{spans[j].Rank, spans[j].Plane, spans[j].Block}] = j
	}
	tp.Spans = spans
	for i := range tp.Pieces {
		p := &tp.Pieces[i]
		s := spans[at[key{p.SrcRank, p.SrcPlane, p.SrcBlock}]]
		p.Scratch = s.ScratchOff + p.SrcOff - s.Off
	}
	tp.Copies = copyRuns(tp.Pieces)
}

// copyRuns groups a staged tile's pieces, in scratch order, into runs of
// one length into one destination block at constant positive strides.
func copyRuns(pieces []Piece) []CopyRun {
	sorted := slices.Clone(pieces)
	slices.SortFunc(sorted, func(a, b Piece) int { return cmp.Compare(a.Scratch, b.Scratch) })
	var out []CopyRun
	for _, p := range sorted {
		if n := len(out); n > 0 {
			r := &out[n-1]
			last, lastDst := r.Scratch+uint64(r.Count-1)*r.ScratchStride, r.DstOff+uint64(r.Count-1)*r.DstStride
			if r.DstBlock == p.DstBlock && r.DstPlane == p.DstPlane && r.Len == p.Len && p.Scratch > last && p.DstOff > lastDst &&
				(r.Count == 1 || p.Scratch-last == r.ScratchStride && p.DstOff-lastDst == r.DstStride) {
				r.ScratchStride, r.DstStride = p.Scratch-last, p.DstOff-lastDst
				r.Count++
				continue
			}
		}
		out = append(out, CopyRun{DstBlock: p.DstBlock, DstPlane: p.DstPlane, Scratch: p.Scratch, DstOff: p.DstOff, Len: p.Len, Count: 1})
	}
	return out
}

// PullSize says what a pull moves: tokens of KV from nSrc holder blocks of
// srcBlockSize tokens that carry numTokens tokens (0: all their slots),
// into nDst blocks of dstBlockSize. Between equal block sizes blocks move
// whole (nDst = nSrc, tokens every slot of them); between different ones
// the tokens are regrouped and nDst is what they need. Errors wrap
// ErrBadBlockIDs.
func PullSize(srcBlockSize uint32, nSrc int, numTokens, dstBlockSize uint32) (tokens uint32, nDst int, err error) {
	if srcBlockSize == 0 || dstBlockSize == 0 || nSrc <= 0 || nSrc > MaxBlockIDs {
		return 0, 0, fmt.Errorf("%w: %d remote blocks of %d tokens into blocks of %d", ErrBadBlockIDs, nSrc, srcBlockSize, dstBlockSize)
	}
	all := uint64(nSrc) * uint64(srcBlockSize)
	if all > 1<<32-1 {
		return 0, 0, fmt.Errorf("%w: %d remote blocks of %d tokens", ErrBadBlockIDs, nSrc, srcBlockSize)
	}
	if srcBlockSize == dstBlockSize {
		return uint32(all), nSrc, nil
	}
	if uint64(numTokens) > all {
		return 0, 0, fmt.Errorf("%w: remote_num_tokens=%d does not fit in %d blocks of %d tokens", ErrBadBlockIDs, numTokens, nSrc, srcBlockSize)
	}
	tokens = uint32(all)
	if numTokens > 0 {
		tokens = numTokens
	}
	return tokens, int((uint64(tokens) + uint64(dstBlockSize) - 1) / uint64(dstBlockSize)), nil
}

func gcd(a, b uint32) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return uint64(a)
}

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
	for layer := uint32(0); layer < t.Src.Layers; layer++ {
		for k := range x.Tiles() {
			if n := x.TileScratch(k); uint64(len(scratch)) < n {
				scratch = make([]byte, n)
			}
			x.StagedReads(layer, k, func(m Move) { copy(scratch[m.DstOff:m.DstOff+m.Len], src[m.Rank][m.SrcOff:m.SrcOff+m.Len]) })
			x.StagedCopies(layer, k, func(r CopyRun, do uint64) { r.CopyOut(dst, do, scratch) })
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
