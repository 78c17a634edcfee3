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
	// regroup is Copies as Transfer.Regroup performs them: by
	// destination block and plane, runs that fill each other's gaps paired.
	regroup []regroupGroup
	// runSpan is the segment table of a staged tile: runSpan[j] is the
	// index in Spans of the span whose bytes Copies[j] reads (each run
	// lies in one), for RegroupFrom.
	runSpan []int
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
	tp.Copies = copyRuns(tp.Pieces, spans)
	tp.runSpan = runSpans(tp.Copies, spans)
	tp.regroup = regroupPlan(tp.Copies)
}

// copyRuns groups a staged tile's pieces, in scratch order, into runs of
// one length into one destination block at constant positive strides,
// each within one of the tile's spans (so that a run can read from a view
// of its span's source instead of the scratch: RegroupFrom).
func copyRuns(pieces []Piece, spans []Span) []CopyRun {
	sorted := slices.Clone(pieces)
	slices.SortFunc(sorted, func(a, b Piece) int { return cmp.Compare(a.Scratch, b.Scratch) })
	var out []CopyRun
	for _, p := range sorted {
		if n := len(out); n > 0 {
			r := &out[n-1]
			last, lastDst := r.Scratch+uint64(r.Count-1)*r.ScratchStride, r.DstOff+uint64(r.Count-1)*r.DstStride
			if r.DstBlock == p.DstBlock && r.DstPlane == p.DstPlane && r.Len == p.Len && p.Scratch > last && p.DstOff > lastDst &&
				(r.Count == 1 || p.Scratch-last == r.ScratchStride && p.DstOff-lastDst == r.DstStride) &&
				spanAt(spans, p.Scratch) == spanAt(spans, r.Scratch) {
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
