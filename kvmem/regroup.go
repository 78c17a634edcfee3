package kvmem

// The regroup of a staged tile: its copy runs (TilePlan.Copies) grouped by
// destination block and plane and paired where two runs fill each other's
// gaps, planned once per translation (regroupPlan) and performed by
// Regroup (from the tile's scratch) or RegroupFrom (regroupfrom.go: from
// the holder's memory in place).

// directBytes is the shortest copy that a Regroup with out moves from
// its source straight to the destination with out (one streaming copy
// each) rather than through buf: passing it through buf would only add a
// write and a read of buf, and out's cost per call is small against it.
// The CPU order's V is such a copy (a head's tokens of one source block:
// 4 KiB at 16 tokens of 128 bfloat16).
const directBytes = 1024

// Regroup performs the copies of tile k of layer layer of a staged
// transfer (StagedCopies) into dst, the destination region, from scratch,
// the tile's once its reads have landed. Two runs of which one fills the
// gaps the other leaves in the destination (the CPU order's K from two
// source blocks of 16 tokens into one of 32: each a 32-byte half of every
// 64-byte row) are performed together, a row at a time, so that each
// destination line is written whole at once.
//
// With out (Out: copies with streaming stores, which write the
// destination without first reading each line into the cache: a third of
// the memory traffic of plain stores) and buf (RegroupBytes), a pair whose
// two runs alternate over a range of the destination is written by
// out.Interleave where it can (two halves of a line from registers, no
// buffer between), and other ranges of the destination are assembled in
// buf and moved to dst with out.Copy. Where every
// pair of a destination block and plane either fills a range of its own
// whole (a head's K rows, 8 KiB at head size 128) or copies directBytes
// or more at a time (the V of a head), each such range goes through buf
// in turn, small enough to stay in the first-level cache, and each long
// copy goes to dst with out.Copy directly. Else, where the tile's copies into
// a destination block and plane write a range of it whole (dense), the
// whole range goes through buf. With the zero Out every copy goes
// straight to dst.
func (x *Transfer) Regroup(layer uint32, k int, dst, scratch, buf []byte, out Out) {
	tp := x.tile(k)
	x.regroup(layer, k, dst, tileBytes{tp: tp, scratch: scratch}, buf, out)
}

// Out is how Regroup and RegroupFrom write the destination when they are
// given one: Copy writes a range of it from its bytes (streaming stores,
// say: a third of the memory traffic of plain stores), Interleave, where
// set, writes a range from two sources in turn, half bytes of each at a
// time (memcopy.InterleaveUnfenced), and reports whether it did (false:
// the regroup assembles the range itself). The zero Out: every copy goes
// straight to the destination.
type Out struct {
	Copy       func(dst, src []byte)
	Interleave func(dst, a, b []byte, half int) bool
}

// regroup is Regroup, and RegroupFrom, with the tile's runs reading from
// src.
func (x *Transfer) regroup(layer uint32, k int, dst []byte, src tileBytes, buf []byte, out Out) {
	t := x.T
	for _, g := range src.tp.regroup {
		base := t.Dst.Offset(layer, g.plane, x.DstIDs[k*int(t.DstBlocks)+int(g.block)])
		switch n := g.hi - g.lo; {
		case out.Copy != nil && g.pairwise:
			g.performPairwise(src, dst, base, buf, out)
		case out.Copy != nil && g.dense && n <= uint64(len(buf)):
			g.perform(src, buf[:n], 0, g.lo)
			out.Copy(dst[base+g.lo:base+g.hi], buf[:n])
		default:
			g.perform(src, dst, base, 0)
		}
	}
}

// RegroupBytes is the buf Regroup wants: the largest range a tile
// assembles in buf (0 when none).
func (x *Transfer) RegroupBytes() uint64 {
	var n uint64
	for _, tp := range []*TilePlan{&x.T.Full, &x.last} {
		for _, g := range tp.regroup {
			switch {
			case g.pairwise:
				for _, pr := range g.pairs {
					if tp.Copies[pr.a].Len < directBytes {
						n = max(n, pr.span)
					}
				}
			case g.dense:
				n = max(n, g.hi-g.lo)
			}
		}
	}
	return n
}

// regroupGroup is the copy runs of a staged tile into one destination
// block and plane (in scratch order, paired), which write [lo, hi) of it:
// every byte of it where dense. Pairwise: each pair copies directBytes
// or more at a time or fills its own range whole.
type regroupGroup struct {
	block, plane uint32
	lo, hi       uint64
	written      uint64 // bytes the copies write
	dense        bool
	pairwise     bool
	pairs        []runPair
}

// perform does the group's copies into dst, from src, where the
// destination block starts at base; offsets within the block less sub.
func (g *regroupGroup) perform(src tileBytes, dst []byte, base, sub uint64) {
	runs := src.tp.Copies
	for _, pr := range g.pairs {
		pr.perform(runs, src, dst, base+runs[pr.a].DstOff-sub)
	}
}

// performPairwise does a pairwise group's copies into dst, where the
// destination block starts at base: long copies straight from src with
// out.Copy, a pair that alternates over its range with out.Interleave
// where it can, each other pair's range assembled in buf and moved with
// out.Copy (or performed in dst, where buf is too small for it).
func (g *regroupGroup) performPairwise(src tileBytes, dst []byte, base uint64, buf []byte, out Out) {
	runs := src.tp.Copies
	for _, pr := range g.pairs {
		r := runs[pr.a]
		d := base + r.DstOff
		switch {
		case r.Len >= directBytes:
			outRun(r, src, pr.a, dst, d, out)
			if pr.b >= 0 {
				outRun(runs[pr.b], src, pr.b, dst, base+runs[pr.b].DstOff, out)
			}
		case pr.interleave(runs, src, dst[d:d+pr.span], out):
		case pr.span <= uint64(len(buf)):
			pr.perform(runs, src, buf[:pr.span], 0)
			out.Copy(dst[d:d+pr.span], buf[:pr.span])
		default:
			pr.perform(runs, src, dst, d)
		}
	}
}

// outRun performs run j of a tile (r) into dst at d from src, each copy
// with out.
func outRun(r CopyRun, src tileBytes, j int, dst []byte, d uint64, out Out) {
	s, so := src.of(j)
	for range r.Count {
		out.Copy(dst[d:d+r.Len], s[so:so+r.Len])
		so, d = so+r.ScratchStride, d+r.DstStride
	}
}

// runPair is a copy run of a staged tile (Copies[a]) and, unless b < 0,
// the run Copies[b] whose copy i lands right after a's copy i. Together
// they write a range of span bytes of the destination block (from a's
// first copy to the end of the last), whole where dense.
type runPair struct {
	a, b  int
	span  uint64
	dense bool
}

// perform does the pair's copies into dst, from src, the pair's first
// copy at d.
func (pr runPair) perform(runs []CopyRun, src tileBytes, dst []byte, d uint64) {
	r := runs[pr.a]
	s, so := src.of(pr.a)
	if pr.b < 0 {
		copyRun(r, s, so, dst, d)
		return
	}
	s2, so2 := src.of(pr.b)
	copyPair(r, s, so, s2, so2, dst, d)
}

// interleave performs a pair whose two runs each read one contiguous
// range and fill alternate pieces of a contiguous destination range, dst
// (the CPU order's K rows from two source blocks of 16 tokens into one of
// 32), with out.Interleave, and reports whether it did.
func (pr runPair) interleave(runs []CopyRun, src tileBytes, dst []byte, out Out) bool {
	if out.Interleave == nil || pr.b < 0 || !pr.dense {
		return false
	}
	r := runs[pr.a]
	if r.ScratchStride != r.Len && r.Count > 1 {
		return false // each run's copies are not end to end in its source
	}
	n := uint64(r.Count) * r.Len
	s, so := src.of(pr.a)
	s2, so2 := src.of(pr.b)
	return out.Interleave(dst, s[so:so+n], s2[so2:so2+n], int(r.Len))
}

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
		pr.span = uint64(r.Count-1)*r.DstStride + ways*r.Len
		pr.dense = uint64(r.Count)*ways*r.Len == pr.span
		gi, ok := index[key{r.DstBlock, r.DstPlane}]
		if !ok {
			gi = len(out)
			index[key{r.DstBlock, r.DstPlane}] = gi
			out = append(out, regroupGroup{block: r.DstBlock, plane: r.DstPlane, lo: r.DstOff, pairwise: true})
		}
		g := &out[gi]
		g.pairs = append(g.pairs, pr)
		g.lo = min(g.lo, r.DstOff)
		g.hi = max(g.hi, r.DstOff+pr.span)
		g.written += uint64(r.Count) * ways * r.Len
		g.pairwise = g.pairwise && (r.Len >= directBytes || pr.dense)
	}
	for i := range out {
		// The pieces of a translation never overlap in the destination
		// (each element is written once): as many bytes as the range is
		// wide fill it.
		out[i].dense = out[i].written == out[i].hi-out[i].lo
	}
	return out
}
