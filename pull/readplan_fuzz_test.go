package pull

import (
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/regionfile"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
	"google.golang.org/protobuf/proto"
)

// FuzzPlanReads binds descriptors a peer sent (any bytes) to a pull into a
// fixed destination: binding never panics, and a plan it accepts writes only
// inside the destination blocks, exactly their bytes, with keys from the
// descriptors.
func FuzzPlanReads(f *testing.F) {
	l := kvmem.Layout{Layers: 2, Planes: 2, Blocks: 8, BlockBytes: 16, BlockSize: 4, TPSize: 1}
	srcIDs := []uint32{1, 2, 3, 6}
	dstIDs := []uint32{4, 5, 0, 7}
	for _, d := range []*messages.Descriptors{
		segmentDescriptors(l, srcIDs),
		{Layout: actors.LayoutToProto(l), BlockIds: srcIDs, ImpliedSegments: true, Rkeys: [][]byte{{1}}, RegionAddr: 1 << 20},
	} {
		seed, err := proto.Marshal(d)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(seed)
	}
	fuzzPlan(f, l, srcIDs, dstIDs)
}

// fuzzPlan fuzzes PlanReads with descriptors (any bytes) for a pull of
// srcIDs into blocks dstIDs of a region laid out as l: binding never
// panics, and a plan it accepts passes checkPlanOps, moving every byte of
// the destination blocks.
func fuzzPlan(f *testing.F, l kvmem.Layout, srcIDs, dstIDs []uint32) {
	r, base, isDst := fuzzDestination(f, l, dstIDs)
	want := uint64(len(srcIDs)) * l.BlockBytes * uint64(l.Layers*l.Planes)
	f.Fuzz(func(t *testing.T, data []byte) {
		desc := new(messages.Descriptors)
		if proto.Unmarshal(data, desc) != nil {
			return
		}
		dst := &kvmem.Mapped{Engine: "e", ID: "r", Region: r, Blocks: kvmem.NewBlockTable(l.Blocks)}
		ops, total, err := PlanReads(desc, srcIDs, dst, dstIDs)
		if err != nil {
			return
		}
		checkPlanOps(t, ops, total, r, base, isDst, keysOf(desc), want)
	})
}

// fuzzDestination makes the destination region of a fuzzed plan, laid out
// as l (closed with f), where its bytes start, and the block slots (offset
// / block size) of blocks dstIDs in every layer and plane.
func fuzzDestination(f *testing.F, l kvmem.Layout, dstIDs []uint32) (*kvmem.Region, uintptr, map[uint64]bool) {
	r, err := regionfile.Create(filepath.Join(f.TempDir(), "r"), l)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { r.Close() })
	isDst := map[uint64]bool{}
	for layer := uint32(0); layer < l.Layers; layer++ {
		for p := uint32(0); p < l.Planes; p++ {
			for _, b := range dstIDs {
				isDst[l.Offset(layer, p, b)/l.BlockBytes] = true
			}
		}
	}
	return r, uintptr(unsafe.Pointer(unsafe.SliceData(r.Bytes()))), isDst
}

// keysOf is every key the descriptors hand out, of every rank.
func keysOf(desc *messages.Descriptors) map[string]bool {
	keys := map[string]bool{}
	for _, k := range desc.Rkeys {
		keys[string(k)] = true
	}
	for _, m := range desc.MoreRanks {
		for _, k := range m.Rkeys {
			keys[string(k)] = true
		}
	}
	return keys
}

// checkPlanOps fails t unless the accepted plan's ops write only inside the
// destination blocks of r (isDst: block slots of every layer and plane;
// base: where r's bytes start), with keys the descriptors handed out, and
// move want bytes, as total says.
func checkPlanOps(t *testing.T, ops []transport.GetOp, total uint64, r *kvmem.Region, base uintptr, isDst map[uint64]bool, keys map[string]bool, want uint64) {
	t.Helper()
	l := r.Layout
	var sum uint64
	for _, op := range ops {
		n := uint64(len(op.Dst))
		off := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(op.Dst))) - base)
		if n == 0 || off+n > uint64(len(r.Bytes())) {
			t.Fatalf("op writes [%d,+%d) outside the region", off, n)
		}
		for b := off / l.BlockBytes; b*l.BlockBytes < off+n; b++ {
			if !isDst[b] {
				t.Fatalf("op writes [%d,+%d): block slot %d is not a destination block", off, n, b)
			}
		}
		if !keys[string(op.RemoteKey)] {
			t.Fatalf("op key %x not among the descriptors' keys", op.RemoteKey)
		}
		sum += n
	}
	if total != want || sum != want {
		t.Fatalf("plan moves %d bytes (ops %d), want %d", total, sum, want)
	}
}

// FuzzTranslatedPlan binds descriptors a peer sent (any bytes) to a pull
// from a TP 2 holder into a TP 1 region, translated: binding never panics,
// and a plan it accepts writes only inside the destination blocks, exactly
// the bytes of the reader's heads, with keys from the descriptors' ranks.
func FuzzTranslatedPlan(f *testing.F) {
	srcIDs := []uint32{1, 2, 3, 6}
	dstIDs := []uint32{4, 5, 0, 7}
	seed, err := proto.Marshal(tpDescriptors(2, srcIDs))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	l := rankLayout(1, 0)
	l.Blocks = 8
	fuzzPlan(f, l, srcIDs, dstIDs)
}
