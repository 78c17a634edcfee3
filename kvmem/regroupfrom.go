package kvmem

import (
	"fmt"
	"slices"
)

// A staged tile regrouped from where its reads would read (RegroupFrom):
// a reader that can see the holder's memory in place (a same-host data
// plane's mapping of it) regroups from there in one pass, instead of
// reading every span into the tile's scratch and regrouping from that.
// Each copy run of a staged tile lies in one of the tile's spans (copyRuns
// never joins pieces of two), so the segment table TilePlan.runSpan, a
// span per run, says which read's bytes a run copies from.

// RegroupFrom is Regroup with the tile's bytes where the holder keeps
// them rather than in a scratch: src[i] holds the bytes of the tile's i-th
// read, in StagedReads' order (Move.Len bytes of the holder's memory at
// the move's source; the scratch would have had them at its DstOff). It
// writes into dst what Regroup would, with buf and out as Regroup uses
// them. src must hold one slice per read, each at least its read's length:
// it panics otherwise.
func (x *Transfer) RegroupFrom(layer uint32, k int, dst []byte, src [][]byte, buf []byte, out Out) {
	tp := x.tile(k)
	if len(src) != len(tp.Spans) {
		panic(fmt.Sprintf("kvmem: RegroupFrom of tile %d with %d source slices for its %d reads", k, len(src), len(tp.Spans)))
	}
	for i, s := range tp.Spans {
		if uint64(len(src[i])) < s.Len {
			panic(fmt.Sprintf("kvmem: RegroupFrom of tile %d: read %d has %d bytes of its %d", k, i, len(src[i]), s.Len))
		}
	}
	x.regroup(layer, k, dst, tileBytes{tp: tp, views: src}, buf, out)
}

// tileBytes is where a staged tile's copy runs read: the tile's scratch
// (views nil), or views[i], the bytes of the tile's read i, for the runs
// in its span (RegroupFrom).
type tileBytes struct {
	tp      *TilePlan
	scratch []byte
	views   [][]byte
}

// of is the bytes run j of the tile reads from and where its first copy
// starts in them.
func (b tileBytes) of(j int) ([]byte, uint64) {
	r := &b.tp.Copies[j]
	if b.views == nil {
		return b.scratch, r.Scratch
	}
	i := b.tp.runSpan[j]
	return b.views[i], r.Scratch - b.tp.Spans[i].ScratchOff
}

// spanAt is the index of the span of spans (in scratch order, end to end
// from 0) that holds scratch offset off.
func spanAt(spans []Span, off uint64) int {
	i, found := slices.BinarySearchFunc(spans, off, func(s Span, off uint64) int {
		switch {
		case s.ScratchOff+s.Len <= off:
			return -1
		case s.ScratchOff > off:
			return 1
		}
		return 0
	})
	if !found {
		return -1
	}
	return i
}

// runSpans is the segment table of a staged tile's copy runs: the span
// each lies in.
func runSpans(runs []CopyRun, spans []Span) []int {
	out := make([]int, len(runs))
	for j, r := range runs {
		out[j] = spanAt(spans, r.Scratch)
	}
	return out
}
