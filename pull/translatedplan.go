package pull

import (
	"fmt"

	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/transport"
)

// translatedPlan is a pull from a holder of another shape (kvmem.Translate
// said not Whole: other TP size or rank split, block size or in-block
// order). A direct translation reads every piece straight into the
// destination blocks (ops); a staged one reads the holder's spans into
// scratch memory a window at a time and regroups them into the destination
// on arrival, here in the puller (run).
type translatedPlan struct {
	x    *kvmem.Transfer
	srcs []*source // by holder rank; nil for ranks the reader needs nothing of
	dst  *kvmem.Mapped
	ops  []transport.GetOp // direct only
	// sops: direct, on a data plane that reads strided ops (ops is then
	// empty): a head range of a token-major block is one op, not one per
	// token.
	sops []transport.StridedOp
}

// stagedWindowBytes is the scratch a staged pull reads into before it
// regroups: the size of a read batch.
const stagedWindowBytes = batchBytes

// planTranslated checks the holder's ranks the translation reads from
// against the hold's block list and plans the pull of numTokens tokens
// (kvmem.PullSize) from srcIDs into dstIDs of dst: direct reads as strided
// ops where the data plane reads those (strided), else as GetOps.
func planTranslated(tr *kvmem.Translation, ranks []rankDesc, srcIDs []uint32, skip int, dstIDs []uint32, numTokens uint32, dst *kvmem.Mapped, strided bool) (*translatedPlan, error) {
	x, err := tr.ForPull(srcIDs[skip:], dstIDs, numTokens)
	if err != nil {
		return nil, err
	}
	p := &translatedPlan{x: x, srcs: make([]*source, len(ranks)), dst: dst}
	for _, r := range tr.Ranks {
		if int(r) >= len(ranks) {
			return nil, fmt.Errorf("%w: no rank %d among the holder's %d", ErrBadDescriptors, r, len(ranks))
		}
		if p.srcs[r], err = ranks[r].seal(srcIDs); err != nil {
			return nil, err
		}
		p.srcs[r].base = skip
	}
	switch {
	case !tr.Staged && strided:
		mem := dst.Region.Bytes()
		x.StridedMoves(func(m kvmem.StridedMove) {
			key, addr := p.srcs[m.Rank].at(m.Layer, m.Plane, m.SrcPos, m.SrcOff)
			end := m.DstOff + uint64(m.Count-1)*m.DstStride + m.Len
			p.sops = append(p.sops, transport.StridedOp{RemoteKey: key, RemoteAddr: addr, RemoteStride: m.SrcStride,
				Dst: mem[m.DstOff:end:end], DstStride: int(m.DstStride), Len: int(m.Len), Count: m.Count})
		})
	case !tr.Staged:
		p.ops = make([]transport.GetOp, 0, x.MaxMoves())
		x.DirectMoves(func(m kvmem.Move) {
			key, addr := p.srcs[m.Rank].at(m.Layer, m.Plane, m.SrcPos, m.SrcOff)
			p.ops = append(p.ops, transport.GetOp{RemoteKey: key, RemoteAddr: addr, Dst: dst.Region.Slice(kvmem.Extent{Off: m.DstOff, Len: m.Len})})
		})
	}
	return p, nil
}

// total is the bytes the pull writes into the destination.
func (p *translatedPlan) total() uint64 { return p.x.Bytes() }

// run performs the pull with r, which reads lists of ops (a batch runner):
// the direct ops (strided or not) at once, or a staged pull's windows one
// after the other, each regrouped into the destination once its reads
// landed.
func (p *translatedPlan) run(r batchReader) error {
	if p.sops != nil {
		return r.strided(p.sops)
	}
	if !p.x.T.Staged {
		return r.get(p.ops)
	}
	read := r.get
	x, layers, tiles := p.x, p.x.T.Src.Layers, p.x.Tiles()
	full, last := x.TileScratch(0), x.TileScratch(tiles-1)
	need := uint64(layers) * (uint64(tiles-1)*full + last)
	scratch := make([]byte, min(max(stagedWindowBytes, full, last), need))
	dstMem := p.dst.Region.Bytes()
	type unit struct {
		layer uint32
		k     int
		base  uint64
	}
	var (
		ops    []transport.GetOp
		window []unit
		used   uint64
	)
	flush := func() error {
		if err := read(ops); err != nil {
			return err
		}
		for _, u := range window {
			x.StagedCopies(u.layer, u.k, func(r kvmem.CopyRun, do uint64) { r.CopyOut(dstMem, do, scratch[u.base:]) })
		}
		ops, window, used = ops[:0], window[:0], 0
		return nil
	}
	for layer := range layers {
		for k := range tiles {
			n := x.TileScratch(k)
			if used+n > uint64(len(scratch)) {
				if err := flush(); err != nil {
					return err
				}
			}
			base := used
			x.StagedReads(layer, k, func(m kvmem.Move) {
				key, addr := p.srcs[m.Rank].at(m.Layer, m.Plane, m.SrcPos, m.SrcOff)
				ops = append(ops, transport.GetOp{RemoteKey: key, RemoteAddr: addr, Dst: scratch[base+m.DstOff : base+m.DstOff+m.Len : base+m.DstOff+m.Len]})
			})
			window = append(window, unit{layer: layer, k: k, base: base})
			used += n
		}
	}
	if len(window) == 0 {
		return nil
	}
	return flush()
}
