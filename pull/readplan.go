package pull

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
)

// ErrBadDescriptors is returned when a holder's descriptors do not match
// the transfer (a bug or a hostile peer); nothing is read then.
var ErrBadDescriptors = errors.New("bad descriptors")

// readPlan is one pull's reads. planDst fills in the destination side from
// the pull's own block ids alone, so that a puller plans while the holder's
// descriptors are on their way; bind then checks the descriptors and fills
// in the source side. A KV pull is thousands of reads: planning them is the
// one cost of a pull that grows with the piece count, and this way it hides
// behind the descriptors round trip.
type readPlan struct {
	layout kvmem.Layout
	runs   []kvmem.Run // runs of srcIDs, in the hold's order (the wire order of segments)
	// ops[i].Dst is final after planDst; until bind, ops[i].RemoteAddr is
	// the offset of the read in hold segment seg[i].
	ops   []transport.GetOp
	seg   []int32
	total uint64
	buf   *planBuf
}

// planBuf is a plan's storage, kept between pulls.
type planBuf struct {
	ops []transport.GetOp
	seg []int32
}

// planBufs keeps a few plan buffers between pulls. Unlike a sync.Pool it is
// not emptied by the garbage collector: fresh memory costs a page fault per
// 4 KiB (~7 µs each on the VMs measured), ~0.5 ms for a KV pull's plan.
var planBufs = make(chan *planBuf, 8)

// maxKeptOps bounds the plan buffers kept: 16384 ops (a 32-layer KV pull
// of up to 256 scattered blocks) at 60 bytes each, so the free list pins at
// most 8 × ~1 MiB; a larger plan is left to the garbage collector.
const maxKeptOps = 1 << 14

// planDst plans the reads that copy source block srcIDs[i] into destination
// block dstIDs[i] of dst, for every layer and plane, coalescing blocks that
// are consecutive on both sides. Each layer and plane is read in ascending
// source order, not in the hold's order: the source then streams forward,
// which the CPU's prefetchers (mapped reads) and the holder's reads
// (checked, tcp) both reward.
//
// pick, when set, is the hold positions srcIDs were picked from (Pull.Pick):
// a run of consecutive ids is split where their positions are not
// consecutive, so that each read stays inside one of the hold's extents.
func planDst(dst *kvmem.Mapped, srcIDs, dstIDs []uint32, pick []int) (*readPlan, error) {
	l := dst.Region.Layout
	if len(srcIDs) != len(dstIDs) {
		return nil, api.Errorf(api.CodeBadBlockIDs, "%d remote blocks but %d destination blocks", len(srcIDs), len(dstIDs))
	}
	p := &readPlan{layout: l, runs: splitRuns(kvmem.Runs(srcIDs), pick)}
	select {
	case p.buf = <-planBufs:
	default:
		p.buf = &planBuf{}
	}
	order := make([]int, len(p.runs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(p.runs[a].First, p.runs[b].First) })
	nseg := int(l.Layers*l.Planes) * len(p.runs)
	ops := slices.Grow(p.buf.ops[:0], nseg)
	seg := slices.Grow(p.buf.seg[:0], nseg)
	bb := l.BlockBytes
	for layer := uint32(0); layer < l.Layers; layer++ {
		for pl := uint32(0); pl < l.Planes; pl++ {
			lp := int(layer*l.Planes + pl)
			for _, ri := range order {
				r := p.runs[ri]
				k := int32(lp*len(p.runs) + ri)
				for j := uint32(0); j < r.Count; {
					d0 := dstIDs[r.Index+int(j)]
					n := uint32(1)
					for j+n < r.Count && dstIDs[r.Index+int(j+n)] == d0+n {
						n++
					}
					ops = append(ops, transport.GetOp{
						RemoteAddr: uint64(j) * bb,
						Dst:        dst.Region.Slice(kvmem.Extent{Off: l.Offset(layer, pl, d0), Len: uint64(n) * bb}),
					})
					seg = append(seg, k)
					p.total += uint64(n) * bb
					j += n
				}
			}
		}
	}
	p.ops, p.seg = ops, seg
	return p, nil
}

// bind checks the descriptors of the holder's rank r (of the same shape
// as the destination: kvmem.Translate said Whole) against the transfer and
// the layout, so that a bad peer can never make us read outside its hold or
// write outside the destination blocks, and fills in every read's source.
func (p *readPlan) bind(r *rankDesc, srcIDs []uint32, skip int, pick []int) error {
	holderLayout := r.layout
	if holderLayout.Layers != p.layout.Layers || holderLayout.Planes != p.layout.Planes || holderLayout.BlockBytes != p.layout.BlockBytes {
		return fmt.Errorf("%w: rank %d's layout is not the reader's shape", ErrBadDescriptors, holderLayout.TPRank)
	}
	src, err := r.seal(srcIDs)
	if err != nil {
		return err
	}
	src.base, src.pick = skip, pick
	nruns := len(p.runs)
	last := -1
	var addr uint64
	var key []byte
	for i := range p.ops {
		if k := int(p.seg[i]); k != last {
			lp, run := uint32(k/nruns), p.runs[k%nruns]
			layer, plane := lp/holderLayout.Planes, lp%holderLayout.Planes
			last = k
			key, addr = src.at(layer, plane, run.Index, holderLayout.Offset(layer, plane, run.First))
		}
		p.ops[i].RemoteKey = key
		p.ops[i].RemoteAddr += addr
	}
	return nil
}

// release keeps the plan's storage for a later pull. Call it once no read
// refers to the ops any more.
func (p *readPlan) release() {
	if p == nil || p.buf == nil {
		return
	}
	clear(p.ops) // drop the references to destinations and keys
	b := p.buf
	b.ops, b.seg = p.ops[:0], p.seg[:0] // the grown storage, not the one planDst started from
	p.buf, p.ops, p.seg = nil, nil, nil
	if cap(b.ops) > maxKeptOps {
		return
	}
	select {
	case planBufs <- b:
	default:
	}
}

// PlanReads turns a hold's descriptors into GetOps that copy the hold's
// blocks srcIDs into destination blocks dstIDs of dst (planPull): source
// block srcIDs[i] into dstIDs[i] in every layer and plane, coalescing
// consecutive blocks on both sides, from a holder of the destination's
// shape; translated pieces from one of another shape. It checks every
// descriptor so that a bad peer can never make us read outside its hold or
// write outside the destination blocks. For direct plans only: a staged
// translation reads into scratch and regroups after its reads land.
func PlanReads(desc *messages.Descriptors, srcIDs []uint32, dst *kvmem.Mapped, dstIDs []uint32) ([]transport.GetOp, uint64, error) {
	var plan *readPlan
	run, total, err := planPull(desc, srcIDs, 0, nil, 0, dst, dstIDs, &plan, kvmem.Translate, false)
	if err != nil {
		return nil, 0, err
	}
	var ops []transport.GetOp
	_ = run(batchReader{get: func(o []transport.GetOp) error {
		ops = append(ops, o...)
		return nil
	}})
	return ops, total, nil
}

// planPull checks a holder's descriptors against a pull of numTokens tokens
// (kvmem.PullSize) of the hold's blocks srcIDs, less its first skip (their
// tokens already in the destination), into dstIDs of dst and plans its
// reads: whole blocks from the holder's rank of the destination's rank
// where the holder has the destination's shape (*plan, made early when the
// params said so, else here), else translated from the ranks that hold the
// destination rank's heads (translate: kvmem.Translate, or a cache of it).
// run performs the reads with a batch reader; total is what they write
// into the destination. With strided, direct translated reads are planned
// as strided ops (a head range of a token-major block is one).
func planPull(desc *messages.Descriptors, srcIDs []uint32, skip int, pick []int, numTokens uint32, dst *kvmem.Mapped, dstIDs []uint32, plan **readPlan,
	translate func(src, dst kvmem.Layout) (*kvmem.Translation, error), strided bool) (run func(batchReader) error, total uint64, err error) {
	dl := dst.Region.Layout
	// The error names neither the holder's blocks nor their count: a
	// caller with wrong params must learn nothing of the hold from it.
	if !slices.Equal(desc.BlockIds, srcIDs) {
		return nil, 0, fmt.Errorf("%w: params.remote_block_ids (%d blocks) are not the hold's blocks", ErrBadDescriptors, len(srcIDs))
	}
	ranks, err := ranksOf(desc)
	if err != nil {
		return nil, 0, err
	}
	tr, err := translate(ranks[0].layout, dl)
	if err != nil {
		return nil, 0, err
	}
	if skip < 0 || skip >= len(srcIDs) {
		return nil, 0, fmt.Errorf("%w: skip_blocks %d of a hold of %d blocks", kvmem.ErrBadBlockIDs, skip, len(srcIDs))
	}
	for _, i := range pick {
		if i < 0 || i >= len(srcIDs) {
			return nil, 0, fmt.Errorf("%w: position %d of a hold of %d blocks", kvmem.ErrBadBlockIDs, i, len(srcIDs))
		}
	}
	if tr.Whole {
		if *plan == nil {
			if *plan, err = planDst(dst, picked(srcIDs, skip, pick), dstIDs, pick); err != nil {
				return nil, 0, err
			}
		}
		p := *plan
		if err := p.bind(&ranks[dl.TPRank], srcIDs, skip, pick); err != nil {
			return nil, 0, err
		}
		return func(r batchReader) error { return r.get(p.ops) }, p.total, nil
	}
	if pick != nil {
		return nil, 0, fmt.Errorf("%w: a pull of some blocks of each KV cache group moves whole blocks, and the holder's shape is not this region's", kvmem.ErrIncompatible)
	}
	if skip > 0 {
		// The skipped tokens must fill whole destination blocks, so that
		// the rest starts a tile of the translation.
		if skipped := uint64(skip) * uint64(tr.Src.BlockSize); skipped%uint64(tr.Dst.BlockSize) != 0 || (numTokens > 0 && skipped >= uint64(numTokens)) {
			return nil, 0, fmt.Errorf("%w: skip_blocks %d of %d tokens is not a whole number of this region's blocks of %d tokens, or not fewer than the pull's %d tokens",
				kvmem.ErrBadBlockIDs, skip, tr.Src.BlockSize, tr.Dst.BlockSize, numTokens)
		} else if numTokens > 0 {
			numTokens -= uint32(skipped)
		}
	}
	tp, err := planTranslated(tr, ranks, srcIDs, skip, dstIDs, numTokens, dst, strided)
	if err != nil {
		return nil, 0, err
	}
	return tp.run, tp.total(), nil
}

// picked is the hold's block ids a pull reads: those at positions pick
// (Pull.Pick), or all but the first skip.
func picked(ids []uint32, skip int, pick []int) []uint32 {
	if pick == nil {
		return ids[skip:]
	}
	out := make([]uint32, len(pick))
	for i, at := range pick {
		out[i] = ids[at]
	}
	return out
}

// splitRuns splits runs (of plan positions) where the hold positions they
// were picked from (pick) are not consecutive; runs as they are without a
// pick.
func splitRuns(runs []kvmem.Run, pick []int) []kvmem.Run {
	if pick == nil {
		return runs
	}
	out := make([]kvmem.Run, 0, len(runs))
	for _, r := range runs {
		start := 0
		for j := 1; j <= int(r.Count); j++ {
			if j == int(r.Count) || pick[r.Index+j] != pick[r.Index+j-1]+1 {
				out = append(out, kvmem.Run{Index: r.Index + start, First: r.First + uint32(start), Count: uint32(j - start)})
				start = j
			}
		}
	}
	return out
}
