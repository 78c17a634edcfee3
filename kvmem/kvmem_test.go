package kvmem

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func testLayout() Layout {
	return Layout{Layers: 3, Planes: 2, Blocks: 8, BlockBytes: 16, BlockSize: 16, TPSize: 1}
}

func TestLayoutValidate(t *testing.T) {
	good := testLayout()
	if err := good.Validate(); err != nil {
		t.Fatalf("valid layout rejected: %v", err)
	}
	bad := []func(*Layout){
		func(l *Layout) { l.Layers = 0 },
		func(l *Layout) { l.Planes = 0 },
		func(l *Layout) { l.Planes = 3 },
		func(l *Layout) { l.Blocks = 0 },
		func(l *Layout) { l.BlockBytes = 0 },
		func(l *Layout) { l.BlockSize = 0 },
		func(l *Layout) { l.TPSize = 0 },
		func(l *Layout) { l.Layers, l.Blocks, l.BlockBytes = 1<<31, 1<<31, 1<<40 },
		// Within the byte bound, but a hold of one block would keep 2^32
		// extents in memory.
		func(l *Layout) { l.Layers, l.Planes, l.Blocks, l.BlockBytes = 1<<31, 2, 1, 1 },
		func(l *Layout) { l.Layers = MaxLayers + 1 },
	}
	for i, mut := range bad {
		l := testLayout()
		mut(&l)
		if err := l.Validate(); !errors.Is(err, ErrBadLayout) {
			t.Errorf("case %d: want ErrBadLayout, got %v", i, err)
		}
	}
}

// TestOnePlaneLayout: vLLM's CPU layout keeps K and V inside each block
// (one plane); a layer is Blocks*BlockBytes contiguous bytes, and it cannot
// exchange blocks with a two-plane region of the same bytes per layer.
func TestOnePlaneLayout(t *testing.T) {
	l := Layout{Layers: 2, Planes: 1, Blocks: 8, BlockBytes: 32, BlockSize: 16, TPSize: 1}
	if err := l.Validate(); err != nil {
		t.Fatalf("one-plane layout rejected: %v", err)
	}
	if got, want := l.Offset(1, 0, 3), uint64((1*8+3)*32); got != want {
		t.Fatalf("offset = %d, want %d", got, want)
	}
	if got, want := l.Size(), uint64(2*8*32); got != want {
		t.Fatalf("size = %d, want %d", got, want)
	}
	two := Layout{Layers: 2, Planes: 2, Blocks: 8, BlockBytes: 16, BlockSize: 16, TPSize: 1}
	if _, err := Translate(l, two); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("one plane vs two planes: want ErrIncompatible, got %v", err)
	}
}

func TestOffsetsAndExtents(t *testing.T) {
	l := testLayout()
	if got := l.Offset(1, 1, 2); got != ((1*2+1)*8+2)*16 {
		t.Fatalf("offset = %d", got)
	}
	got := l.Extents([]uint32{2, 3, 4, 7, 0})
	if len(got) != 3*2*3 {
		t.Fatalf("want 18 extents, got %d", len(got))
	}
	want0 := []Extent{{Off: 2 * 16, Len: 48}, {Off: 7 * 16, Len: 16}, {Off: 0, Len: 16}}
	if !reflect.DeepEqual(got[:3], want0) {
		t.Fatalf("layer 0 K extents = %v, want %v", got[:3], want0)
	}
	if got[3].Off != l.Offset(0, 1, 2) {
		t.Fatalf("second plane starts at %d", got[3].Off)
	}
	var total uint64
	for _, e := range got {
		total += e.Len
	}
	if total != 5*3*2*16 {
		t.Fatalf("extents cover %d bytes", total)
	}
}

func TestRuns(t *testing.T) {
	got := Runs([]uint32{5, 6, 7, 1, 2, 9})
	want := []Run{{0, 5, 3}, {3, 1, 2}, {5, 9, 1}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("runs = %v, want %v", got, want)
	}
}

func TestValidateBlockIDs(t *testing.T) {
	cases := []struct {
		ids []uint32
		ok  bool
	}{
		{[]uint32{0, 7}, true},
		{nil, false},
		{[]uint32{8}, false},
		{[]uint32{1, 1}, false},
		{[]uint32{0, 1, 2, 3, 4, 5, 6, 7, 0}, false},
	}
	for _, c := range cases {
		err := ValidateBlockIDs(c.ids, 8)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrBadBlockIDs)) {
			t.Errorf("ids %v: err = %v, want ok=%v", c.ids, err, c.ok)
		}
	}
}

func TestCompatible(t *testing.T) {
	a := testLayout()
	b := a
	b.Blocks = 100
	if tr, err := Translate(a, b); err != nil || !tr.Whole {
		t.Fatalf("different block counts must move whole blocks: %+v %v", tr, err)
	}
	for _, mut := range []func(*Layout){
		func(l *Layout) { l.TPSize = 2 },
		func(l *Layout) { l.BlockSize = 32 },
		func(l *Layout) { l.Layers = 4 },
		func(l *Layout) { l.BlockBytes = 32 },
	} {
		c := a
		mut(&c)
		if _, err := Translate(a, c); !errors.Is(err, ErrIncompatible) {
			t.Errorf("want ErrIncompatible for %+v, got %v", c, err)
		}
	}
}

func TestBlockTable(t *testing.T) {
	bt := NewBlockTable(8)
	if err := bt.Hold([]uint32{1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := bt.Hold([]uint32{2, 3}); err != nil {
		t.Fatal(err)
	}
	if c := bt.Counts(); c.Held != 3 || c.Free != 5 {
		t.Fatalf("counts %+v", c)
	}
	if err := bt.Unhold([]uint32{1, 2}); err != nil {
		t.Fatal(err)
	}
	if err := bt.Unhold([]uint32{1, 2}); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("double free: want ErrNotHeld, got %v", err)
	}
	if c := bt.Counts(); c.Held != 2 {
		t.Fatalf("a failed unhold must change nothing: %+v", c)
	}
	if err := bt.BeginWrite([]uint32{4, 5}); err != nil {
		t.Fatal(err)
	}
	if err := bt.BeginWrite([]uint32{5, 6}); !errors.Is(err, ErrBlocksBusy) {
		t.Fatalf("want ErrBlocksBusy, got %v", err)
	}
	bt.EndWrite([]uint32{4, 5})
	if err := bt.BeginWrite([]uint32{5, 6}); err != nil {
		t.Fatal(err)
	}
	if err := bt.Hold([]uint32{8}); !errors.Is(err, ErrBadBlockIDs) {
		t.Fatalf("out of range: %v", err)
	}
}

func TestRegionTableRefcounts(t *testing.T) {
	path := "/dev/shm/r"
	l := testLayout()
	heap := &heapOpener{}
	rt := NewRegionTable(heap)
	if _, err := rt.Register("e", "r0", path, l); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Register("e", "r0", path, l); err != nil {
		t.Fatalf("idempotent re-register: %v", err)
	}
	other := l
	other.BlockSize = 32
	if _, err := rt.Register("e", "r0", path, other); !errors.Is(err, ErrRegionExists) {
		t.Fatalf("conflicting re-register: %v", err)
	}
	m, release, err := rt.Acquire("e", "r0")
	if err != nil {
		t.Fatal(err)
	}
	if n := rt.DropEngine("e"); n != 1 {
		t.Fatalf("dropped %d", n)
	}
	if _, _, err := rt.Acquire("e", "r0"); !errors.Is(err, ErrUnknownRegion) {
		t.Fatalf("dropped region still acquirable: %v", err)
	}
	if m.Region.Bytes() == nil {
		t.Fatal("region unmapped while a reference is held")
	}
	release()
	release()
	if m.Region.Bytes() != nil {
		t.Fatal("region still mapped after the last reference")
	}
	if heap.opened != 1 || heap.freed != 1 {
		t.Fatalf("opened %d regions and freed %d, want 1 and 1", heap.opened, heap.freed)
	}
	rt.Close()
	if !heap.closed {
		t.Fatal("the table's Close left its opener open")
	}
}

// TestCheckExtents: a block list whose extents (layers × planes × runs)
// pass MaxExtents is refused before anything is allocated for it; one just
// under passes, and contiguous blocks count one run.
func TestCheckExtents(t *testing.T) {
	l := testLayout()
	l.Layers, l.Planes, l.Blocks = 256, 2, MaxBlocks
	scattered := func(n int) []uint32 {
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = uint32(2 * i)
		}
		return ids
	}
	perRun := uint64(l.Layers) * uint64(l.Planes)
	under := scattered(int(MaxExtents / perRun))
	if err := l.CheckExtents(under); err != nil {
		t.Fatalf("%d scattered blocks (%d extents): %v", len(under), uint64(len(under))*perRun, err)
	}
	over := scattered(int(MaxExtents/perRun) + 1)
	if err := l.CheckExtents(over); !errors.Is(err, ErrBadBlockIDs) || !strings.Contains(err.Error(), "at most 4194304") {
		t.Fatalf("%d scattered blocks: want ErrBadBlockIDs naming the bound, got %v", len(over), err)
	}
	contiguous := make([]uint32, MaxBlockIDs)
	for i := range contiguous {
		contiguous[i] = uint32(i)
	}
	if err := l.CheckExtents(contiguous); err != nil {
		t.Fatalf("%d contiguous blocks (one run): %v", len(contiguous), err)
	}
	if got := len(l.Extents(contiguous[:3])); got != 512 {
		t.Fatalf("Extents of one run: %d, want one a layer and plane (512)", got)
	}
}
