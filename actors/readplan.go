package actors

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
func planDst(dst *kvmem.Mapped, srcIDs, dstIDs []uint32) (*readPlan, error) {
	l := dst.Region.Layout
	if len(srcIDs) != len(dstIDs) {
		return nil, api.Errorf(api.CodeBadBlockIDs, "%d remote blocks but %d destination blocks", len(srcIDs), len(dstIDs))
	}
	p := &readPlan{layout: l, runs: kvmem.Runs(srcIDs)}
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

// bind checks a holder's descriptors against the transfer and the layout,
// so that a bad peer can never make us read outside its hold or write
// outside the destination blocks, and fills in every read's source.
func (p *readPlan) bind(desc *messages.Descriptors, srcIDs []uint32) error {
	// The error names neither the holder's blocks nor their count: a
	// caller with wrong params must learn nothing of the hold from it.
	if !slices.Equal(desc.BlockIds, srcIDs) {
		return fmt.Errorf("%w: params.remote_block_ids (%d blocks) are not the hold's blocks", ErrBadDescriptors, len(srcIDs))
	}
	holderLayout := LayoutFromProto(desc.Layout)
	if err := holderLayout.CompatibleWith(p.layout); err != nil {
		return err
	}
	// seg returns segment k of the hold (layer-major, then plane, then run
	// in the hold's order): from the descriptors, or, with implied
	// segments, from the holder's layout (validated below) and region
	// address.
	nruns := len(p.runs)
	var seg func(k int) (addr, length uint64, rkey uint32)
	if desc.ImpliedSegments {
		// One key covers the hold: derive the segments from the holder's
		// layout instead of receiving them.
		if len(desc.Rkeys) != 1 || len(desc.Segments) != 0 {
			return fmt.Errorf("%w: implied segments with %d keys and %d segments", ErrBadDescriptors, len(desc.Rkeys), len(desc.Segments))
		}
		if holderLayout.Validate() != nil {
			return fmt.Errorf("%w: holder layout invalid", ErrBadDescriptors)
		}
		for _, id := range srcIDs {
			if id >= holderLayout.Blocks {
				return fmt.Errorf("%w: block %d outside the holder's %d blocks", ErrBadDescriptors, id, holderLayout.Blocks)
			}
		}
		seg = func(k int) (uint64, uint64, uint32) {
			lp, r := uint32(k/nruns), p.runs[k%nruns]
			off := holderLayout.Offset(lp/holderLayout.Planes, lp%holderLayout.Planes, r.First)
			return desc.RegionAddr + off, uint64(r.Count) * holderLayout.BlockBytes, 0
		}
	} else {
		if want := int(p.layout.Layers*p.layout.Planes) * nruns; len(desc.Segments) != want {
			return fmt.Errorf("%w: %d segments, want %d", ErrBadDescriptors, len(desc.Segments), want)
		}
		seg = func(k int) (uint64, uint64, uint32) {
			sg := desc.Segments[k]
			return sg.GetRemoteAddr(), sg.GetLength(), sg.GetRkey()
		}
	}
	bb := p.layout.BlockBytes
	last := -1
	var addr uint64
	var key []byte
	for i := range p.ops {
		if k := int(p.seg[i]); k != last {
			a, length, rkey := seg(k)
			if length != uint64(p.runs[k%nruns].Count)*bb || int(rkey) >= len(desc.Rkeys) {
				return fmt.Errorf("%w: segment %d (len %d, rkey %d)", ErrBadDescriptors, k, length, rkey)
			}
			last, addr, key = k, a, desc.Rkeys[rkey]
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

// PlanReads turns a hold's descriptors into GetOps that copy source block
// srcIDs[i] into destination block dstIDs[i] of dst, for every layer and
// plane, coalescing consecutive blocks on both sides; it checks every
// descriptor against the layout so a bad peer can never make us write
// outside the destination blocks. Pullers plan in two steps (planDst while
// the descriptors travel, then bind); this is both at once.
func PlanReads(desc *messages.Descriptors, srcIDs []uint32, dst *kvmem.Mapped, dstIDs []uint32) ([]transport.GetOp, uint64, error) {
	p, err := planDst(dst, srcIDs, dstIDs)
	if err != nil {
		return nil, 0, err
	}
	if err := p.bind(desc, srcIDs); err != nil {
		return nil, 0, err
	}
	return p.ops, p.total, nil
}
