package pull

import (
	"fmt"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
)

// rankDesc is where one TP rank of a hold lies, from its descriptors:
// Descriptors' own fields for rank 0, a RankDescriptors for the others.
type rankDesc struct {
	layout     kvmem.Layout
	rkeys      [][]byte
	segments   []*messages.Segment
	implied    bool
	regionAddr uint64
}

// ranksOf checks the ranks a holder's descriptors list (rank 0, then
// more_ranks: one per rank of its TP size, each laid out as rank 0 but for
// its rank) and returns them by rank. A bad or hostile peer gets
// ErrBadDescriptors.
func ranksOf(desc *messages.Descriptors) ([]rankDesc, error) {
	first := rankDesc{layout: actors.LayoutFromProto(desc.Layout), rkeys: desc.Rkeys, segments: desc.Segments, implied: desc.ImpliedSegments, regionAddr: desc.RegionAddr}
	if err := first.layout.Validate(); err != nil {
		return nil, fmt.Errorf("%w: holder layout: %v", ErrBadDescriptors, err)
	}
	if first.layout.TPRank != 0 || uint64(len(desc.MoreRanks)) != uint64(first.layout.TPSize)-1 {
		return nil, fmt.Errorf("%w: %d ranks described, rank %d first, for tp_size %d", ErrBadDescriptors, 1+len(desc.MoreRanks), first.layout.TPRank, first.layout.TPSize)
	}
	out := make([]rankDesc, 0, first.layout.TPSize)
	out = append(out, first)
	for i, m := range desc.GetMoreRanks() {
		r := rankDesc{layout: actors.LayoutFromProto(m.Layout), rkeys: m.Rkeys, segments: m.Segments, implied: m.ImpliedSegments, regionAddr: m.RegionAddr}
		want := first.layout
		want.TPRank = uint32(i + 1)
		if r.layout != want {
			return nil, fmt.Errorf("%w: rank %d's layout differs from rank 0's", ErrBadDescriptors, i+1)
		}
		out = append(out, r)
	}
	return out, nil
}

// source says where a rank's bytes are: the key and remote address of
// byte off (a region offset) of the block at position pos of the hold's
// list, in layer and plane; reads of runLen bytes from there stay inside
// one registered extent. seal must have succeeded.
type source struct {
	r      *rankDesc
	runs   []kvmem.Run
	runOf  []int32 // the run of each position of the hold's list
	layout kvmem.Layout
	// base is the position in the hold's list of a plan's position 0: the
	// leading blocks a pull skips (Pull.Skip).
	base int
	// pick, when set, is the hold position of each plan position
	// (Pull.Pick); base is 0 then.
	pick []int
}

// seal checks the rank's keys and segments against the hold's block list
// (as bind does for a homogeneous pull) and returns its source.
func (r *rankDesc) seal(srcIDs []uint32) (*source, error) {
	s := &source{r: r, runs: kvmem.Runs(srcIDs), runOf: make([]int32, len(srcIDs)), layout: r.layout}
	for i, run := range s.runs {
		for j := range run.Count {
			s.runOf[run.Index+int(j)] = int32(i)
		}
	}
	l := r.layout
	if r.implied {
		if len(r.rkeys) != 1 || len(r.segments) != 0 {
			return nil, fmt.Errorf("%w: rank %d: implied segments with %d keys and %d segments", ErrBadDescriptors, l.TPRank, len(r.rkeys), len(r.segments))
		}
		for _, id := range srcIDs {
			if id >= l.Blocks {
				return nil, fmt.Errorf("%w: rank %d: block %d outside the holder's %d blocks", ErrBadDescriptors, l.TPRank, id, l.Blocks)
			}
		}
		return s, nil
	}
	if want := int(l.Layers*l.Planes) * len(s.runs); len(r.segments) != want {
		return nil, fmt.Errorf("%w: rank %d: %d segments, want %d", ErrBadDescriptors, l.TPRank, len(r.segments), want)
	}
	for k, sg := range r.segments {
		if sg.GetLength() != uint64(s.runs[k%len(s.runs)].Count)*l.BlockBytes || int(sg.GetRkey()) >= len(r.rkeys) {
			return nil, fmt.Errorf("%w: rank %d: segment %d (len %d, rkey %d)", ErrBadDescriptors, l.TPRank, k, sg.GetLength(), sg.GetRkey())
		}
	}
	return s, nil
}

// at is the key and remote address of a read at region offset off, which
// starts in the block at position pos of the hold's list, in layer and
// plane.
func (s *source) at(layer, plane uint32, pos int, off uint64) ([]byte, uint64) {
	if s.r.implied {
		return s.r.rkeys[0], s.r.regionAddr + off
	}
	hp := pos + s.base
	if s.pick != nil {
		hp = s.pick[pos]
	}
	ri := int(s.runOf[hp])
	run := s.runs[ri]
	sg := s.r.segments[int(layer*s.layout.Planes+plane)*len(s.runs)+ri]
	return s.r.rkeys[sg.GetRkey()], sg.GetRemoteAddr() + off - s.layout.Offset(layer, plane, run.First)
}
