package pull

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/errcode"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/regionfile"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
	"google.golang.org/protobuf/proto"
)

func TestSplitOps(t *testing.T) {
	dst := make([]byte, 10)
	ops := splitOps([]transport.GetOp{{RemoteAddr: 100, Dst: dst}, {RemoteAddr: 7, Dst: make([]byte, 3)}}, 4)
	if len(ops) != 4 {
		t.Fatalf("%d ops", len(ops))
	}
	wantAddr := []uint64{100, 104, 108, 7}
	wantLen := []int{4, 4, 2, 3}
	for i, op := range ops {
		if op.RemoteAddr != wantAddr[i] || len(op.Dst) != wantLen[i] || cap(op.Dst) != len(op.Dst) {
			t.Fatalf("op %d: addr %d len %d cap %d", i, op.RemoteAddr, len(op.Dst), cap(op.Dst))
		}
	}
	ops[1].Dst[0] = 9
	if dst[4] != 9 {
		t.Fatal("split ops must alias the destination")
	}
}

func mapped(t *testing.T, l kvmem.Layout) *kvmem.Mapped {
	t.Helper()
	r, err := regionfile.Create(filepath.Join(t.TempDir(), "r"), l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return &kvmem.Mapped{Engine: "e", ID: "r", Region: r, Blocks: kvmem.NewBlockTable(l.Blocks)}
}

// segmentDescriptors describes a hold of ids in a region of layout l at
// address 0, with one key per segment (key i is the byte i).
func segmentDescriptors(l kvmem.Layout, ids []uint32) *messages.Descriptors {
	d := &messages.Descriptors{Layout: actors.LayoutToProto(l), BlockIds: ids}
	for _, e := range l.Extents(ids) {
		d.Rkeys = append(d.Rkeys, []byte{byte(len(d.Rkeys))})
		d.Segments = append(d.Segments, &messages.Segment{RemoteAddr: e.Off, Length: e.Len, Rkey: uint32(len(d.Rkeys) - 1)})
	}
	return d
}

// readAndCompare executes ops against src's region (an op's RemoteAddr
// less base is its offset there), then checks that in every layer and
// plane dst's block dstIDs[i] holds src's block srcIDs[i].
func readAndCompare(t *testing.T, src, dst *kvmem.Mapped, base uint64, ops []transport.GetOp, srcIDs, dstIDs []uint32) {
	t.Helper()
	for _, op := range ops {
		off := op.RemoteAddr - base
		copy(op.Dst, src.Region.Bytes()[off:off+uint64(len(op.Dst))])
	}
	l := src.Region.Layout
	for layer := uint32(0); layer < l.Layers; layer++ {
		for p := uint32(0); p < l.Planes; p++ {
			for i := range srcIDs {
				if !bytes.Equal(src.Region.Block(layer, p, srcIDs[i]), dst.Region.Block(layer, p, dstIDs[i])) {
					t.Fatalf("layer %d plane %d block %d->%d differs", layer, p, srcIDs[i], dstIDs[i])
				}
			}
		}
	}
}

// TestPlanReads checks the mapping of source blocks to destination blocks
// in every layer and plane, and that hostile descriptors are refused.
func TestPlanReads(t *testing.T) {
	l := kvmem.Layout{Layers: 2, Planes: 2, Blocks: 8, BlockBytes: 16, BlockSize: 4, TPSize: 1}
	src := mapped(t, l)
	dst := mapped(t, l)
	for i := range src.Region.Bytes() {
		src.Region.Bytes()[i] = byte(i)
	}
	srcIDs := []uint32{1, 2, 3, 6}
	dstIDs := []uint32{4, 5, 0, 7}
	desc := segmentDescriptors(l, srcIDs)
	segs, rkeys := desc.Segments, desc.Rkeys
	ops, total, err := PlanReads(desc, srcIDs, dst, dstIDs)
	if err != nil {
		t.Fatal(err)
	}
	if total != uint64(len(srcIDs))*16*4 {
		t.Fatalf("total %d", total)
	}
	// Execute the plan against the source region (RemoteAddr is the offset).
	readAndCompare(t, src, dst, 0, ops, srcIDs, dstIDs)
	// Hostile or mismatched descriptors.
	bad := []func(d *messages.Descriptors){
		func(d *messages.Descriptors) { d.Segments = d.Segments[1:] },
		func(d *messages.Descriptors) {
			d.Segments[0] = &messages.Segment{RemoteAddr: 0, Length: 1 << 30, Rkey: 0}
		},
		func(d *messages.Descriptors) { d.Segments[0] = &messages.Segment{Length: segs[0].Length, Rkey: 99} },
		func(d *messages.Descriptors) { d.BlockIds = []uint32{1, 2, 3, 5} },
	}
	for i, mut := range bad {
		d := &messages.Descriptors{Layout: desc.Layout, BlockIds: append([]uint32(nil), srcIDs...), Rkeys: rkeys, Segments: append([]*messages.Segment(nil), segs...)}
		mut(d)
		if _, _, err := PlanReads(d, srcIDs, dst, dstIDs); !errors.Is(err, ErrBadDescriptors) {
			t.Errorf("case %d: want ErrBadDescriptors, got %v", i, err)
		}
	}
	if _, _, err := PlanReads(desc, srcIDs, dst, dstIDs[:3]); errcode.Of(err) != api.CodeBadBlockIDs {
		t.Errorf("count mismatch: %v", err)
	}
	other := l
	other.BlockBytes = 32
	d2 := &messages.Descriptors{Layout: actors.LayoutToProto(other), BlockIds: srcIDs, Rkeys: rkeys, Segments: segs}
	if _, _, err := PlanReads(d2, srcIDs, dst, dstIDs); !errors.Is(err, kvmem.ErrIncompatible) {
		t.Errorf("layout mismatch: %v", err)
	}
}

// TestPlanReadsImpliedSegments: with one key for the whole hold the
// puller derives the segments from the holder's layout, which may have a
// different block count than the destination.
func TestPlanReadsImpliedSegments(t *testing.T) {
	hl := kvmem.Layout{Layers: 2, Planes: 2, Blocks: 16, BlockBytes: 16, BlockSize: 4, TPSize: 1}
	dl := hl
	dl.Blocks = 8
	src := mapped(t, hl)
	dst := mapped(t, dl)
	for i := range src.Region.Bytes() {
		src.Region.Bytes()[i] = byte(i * 7)
	}
	srcIDs := []uint32{15, 3, 4, 9}
	dstIDs := []uint32{0, 6, 7, 2}
	desc := &messages.Descriptors{Layout: actors.LayoutToProto(hl), BlockIds: srcIDs, Rkeys: [][]byte{{1}}, ImpliedSegments: true, RegionAddr: 1000}
	ops, _, err := PlanReads(desc, srcIDs, dst, dstIDs)
	if err != nil {
		t.Fatal(err)
	}
	readAndCompare(t, src, dst, 1000, ops, srcIDs, dstIDs)
	bad := proto.Clone(desc).(*messages.Descriptors)
	bad.Rkeys = [][]byte{{1}, {2}}
	if _, _, err := PlanReads(bad, srcIDs, dst, dstIDs); !errors.Is(err, ErrBadDescriptors) {
		t.Fatalf("two keys with implied segments: %v", err)
	}
	small := proto.Clone(desc).(*messages.Descriptors)
	small.Layout = actors.LayoutToProto(dl) // the holder claims 8 blocks but names block 15
	if _, _, err := PlanReads(small, srcIDs, dst, dstIDs); !errors.Is(err, ErrBadDescriptors) {
		t.Fatalf("block outside the holder's layout: %v", err)
	}
}

// TestPlanReadsSourceOrder: a hold listed in shuffled block order is read
// in ascending source order (the source streams forward), and every block
// still lands where the pull asked for it.
func TestPlanReadsSourceOrder(t *testing.T) {
	l := kvmem.Layout{Layers: 3, Planes: 2, Blocks: 16, BlockBytes: 16, BlockSize: 4, TPSize: 1}
	src := mapped(t, l)
	dst := mapped(t, l)
	for i := range src.Region.Bytes() {
		src.Region.Bytes()[i] = byte(i * 7)
	}
	srcIDs := []uint32{9, 2, 14, 3, 4, 0, 11}
	dstIDs := []uint32{1, 8, 3, 9, 10, 15, 6}
	desc := segmentDescriptors(l, srcIDs)
	segs := desc.Segments
	ops, _, err := PlanReads(desc, srcIDs, dst, dstIDs)
	if err != nil {
		t.Fatal(err)
	}
	for i, op := range ops {
		// Each read names the key of the segment it lies in.
		sg := segs[op.RemoteKey[0]]
		if op.RemoteAddr < sg.RemoteAddr || op.RemoteAddr+uint64(len(op.Dst)) > sg.RemoteAddr+sg.Length {
			t.Fatalf("op %d reads [%d,+%d) with the key of segment [%d,+%d)", i, op.RemoteAddr, len(op.Dst), sg.RemoteAddr, sg.Length)
		}
	}
	for i := 1; i < len(ops); i++ {
		if ops[i].RemoteAddr <= ops[i-1].RemoteAddr {
			t.Fatalf("op %d reads %d after op %d read %d: not in ascending source order", i, ops[i].RemoteAddr, i-1, ops[i-1].RemoteAddr)
		}
	}
	readAndCompare(t, src, dst, 0, ops, srcIDs, dstIDs)
}

// TestPlanBuffersReused: a released plan's storage serves the next plan,
// which reads exactly its own blocks (nothing left over from the first).
func TestPlanBuffersReused(t *testing.T) {
	l := kvmem.Layout{Layers: 2, Planes: 2, Blocks: 16, BlockBytes: 32, BlockSize: 4, TPSize: 1}
	src := mapped(t, l)
	for i := range src.Region.Bytes() {
		src.Region.Bytes()[i] = byte(i * 13)
	}
	run := func(srcIDs, dstIDs []uint32) (*readPlan, *kvmem.Mapped) {
		dst := mapped(t, l)
		p, err := planDst(dst, srcIDs, dstIDs, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := ranksOf(segmentDescriptors(l, srcIDs))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.bind(&r[0], srcIDs, 0, nil); err != nil {
			t.Fatal(err)
		}
		readAndCompare(t, src, dst, 0, p.ops, srcIDs, dstIDs)
		return p, dst
	}
	for len(planBufs) > 0 { // start from an empty free list
		<-planBufs
	}
	first, _ := run([]uint32{15, 1, 7, 3, 11, 9, 5, 13}, []uint32{0, 2, 4, 6, 8, 10, 12, 14})
	firstOps := &first.ops[:1][0]
	first.release()
	if len(planBufs) != 1 {
		t.Fatalf("released plan not kept: %d buffers", len(planBufs))
	}
	second, _ := run([]uint32{4, 5}, []uint32{9, 10})
	defer second.release()
	if &second.ops[:1][0] != firstOps {
		t.Fatal("second plan did not reuse the released storage")
	}
	if len(second.ops) != 4 { // 2 layers x 2 planes x one coalesced run
		t.Fatalf("second plan has %d ops, want 4", len(second.ops))
	}
}

// TestDescriptorsErrCodes: the code a PullDone carries when the descriptors
// request fails. A shutdown that cancels the request while the reply
// travels must read as transfer_failed, not internal (seen in
// TestReaderShutdownDuringPull).
func TestDescriptorsErrCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want api.Code
	}{
		{"canceled", fmt.Errorf("api: peer.descriptors on member h: %w", context.Canceled), api.CodeTransferFailed},
		{"timeout", api.Errorf(api.CodeTimeout, "peer.descriptors on member h: deadline"), api.CodeTimeout},
		{"holder said expired", api.Errorf(api.CodeExpired, "expired"), api.CodeExpired},
		{"no responders", api.Errorf(api.CodePeerUnavailable, "gone"), api.CodePeerUnavailable},
	} {
		err := descriptorsErr("p1", "h", nil, tc.err)
		if got := errcode.Of(err); got != tc.want {
			t.Errorf("%s: code %d (%s), want %d: %v", tc.name, got, got.Name(), tc.want, err)
		}
		if !strings.Contains(err.Error(), "pull p1: descriptors from h") {
			t.Errorf("%s: error lacks context: %v", tc.name, err)
		}
	}
}
