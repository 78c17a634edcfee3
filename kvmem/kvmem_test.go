package kvmem

import (
	"errors"
	"os"
	"path/filepath"
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
		func(l *Layout) { l.Planes = 1 },
		func(l *Layout) { l.Blocks = 0 },
		func(l *Layout) { l.BlockBytes = 0 },
		func(l *Layout) { l.BlockSize = 0 },
		func(l *Layout) { l.TPSize = 0 },
		func(l *Layout) { l.Layers, l.Blocks, l.BlockBytes = 1<<31, 1<<31, 1<<40 },
	}
	for i, mut := range bad {
		l := testLayout()
		mut(&l)
		if err := l.Validate(); !errors.Is(err, ErrBadLayout) {
			t.Errorf("case %d: want ErrBadLayout, got %v", i, err)
		}
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
	if err := a.CompatibleWith(b); err != nil {
		t.Fatalf("different block counts must be compatible: %v", err)
	}
	for _, mut := range []func(*Layout){
		func(l *Layout) { l.TPSize = 2 },
		func(l *Layout) { l.BlockSize = 32 },
		func(l *Layout) { l.Layers = 4 },
		func(l *Layout) { l.BlockBytes = 32 },
	} {
		c := a
		mut(&c)
		if err := a.CompatibleWith(c); !errors.Is(err, ErrIncompatible) {
			t.Errorf("want ErrIncompatible for %+v, got %v", c, err)
		}
	}
}

func TestRegionSharedMapping(t *testing.T) {
	path := filepath.Join(t.TempDir(), "region")
	l := testLayout()
	eng, err := CreateRegion(path, l)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	d, err := OpenRegion(path, l)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	copy(eng.Block(2, 1, 5), "hello, kv block!")
	if got := string(d.Block(2, 1, 5)); got != "hello, kv block!" {
		t.Fatalf("shared mapping sees %q", got)
	}
	wrong := l
	wrong.Blocks = 9
	if _, err := OpenRegion(path, wrong); !errors.Is(err, ErrBadLayout) {
		t.Fatalf("size mismatch: want ErrBadLayout, got %v", err)
	}
	if _, err := OpenRegion(filepath.Join(t.TempDir(), "missing"), l); !errors.Is(err, ErrRegion) {
		t.Fatalf("missing file: want ErrRegion, got %v", err)
	}
	if _, err := OpenRegion(os.TempDir(), l); err == nil {
		t.Fatal("a directory must not open as a region")
	}
	if err := d.Close(); err != nil || d.Close() != nil {
		t.Fatal("close must be idempotent")
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
	path := filepath.Join(t.TempDir(), "r")
	l := testLayout()
	eng, err := CreateRegion(path, l)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	rt := NewRegionTable()
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
}

// A memfd region is mapped by another "engine" through its path, both
// mappings see each other's writes, and nothing is left in the file system.
func TestMemfdRegionSharedThroughPath(t *testing.T) {
	l := Layout{Layers: 2, Planes: 2, Blocks: 8, BlockBytes: 4096, BlockSize: 16, TPSize: 1}
	r, err := CreateMemfdRegion("test", l)
	if err != nil {
		t.Fatal(err)
	}
	// Sealed: nobody who opens its path can shrink (or grow) it.
	for _, size := range []int64{4096, int64(l.Size()) * 2} {
		if err := os.Truncate(r.Path, size); err == nil {
			t.Fatalf("truncating the created memfd to %d bytes succeeded; it must be sealed", size)
		}
	}
	testCreatedRegionShared(t, r, l, MemoryMemfd)
}

// A region in shm_dir behaves as a memfd one and leaves no file in the
// directory, even while it is live.
func TestShmRegionSharedThroughPath(t *testing.T) {
	dir := t.TempDir()
	l := Layout{Layers: 2, Planes: 2, Blocks: 8, BlockBytes: 4096, BlockSize: 16, TPSize: 1}
	r, err := CreateShmRegion(dir, "test", l)
	if err != nil {
		t.Skipf("the file system of %s has no unnamed files (O_TMPFILE): %v", dir, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("shm_dir holds %d files while the region is live, want none", len(ents))
	}
	testCreatedRegionShared(t, r, l, MemoryShm)
	if _, err := CreateShmRegion(filepath.Join(dir, "missing"), "test", l); !errors.Is(err, ErrRegion) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("region in a missing shm_dir: %v, want ErrRegion naming the directory", err)
	}
}

// Which pages a shm_dir's file system gives.
func TestShmDirPages(t *testing.T) {
	for _, c := range []struct{ fstype, opts, want string }{
		{"tmpfs", "rw,relatime,size=4194304k,huge=always", "2MiB"},
		{"tmpfs", "rw,huge=within_size", "2MiB"},
		{"tmpfs", "rw,huge=advise", "4KiB"},
		{"tmpfs", "rw,relatime", "4KiB"},
		{"hugetlbfs", "rw,pagesize=2M", "2MiB"},
		{"ext4", "rw,huge=always", "4KiB"},
	} {
		if got := pagesOf(c.fstype, c.opts); got != c.want {
			t.Errorf("pagesOf(%s, %s) = %s, want %s", c.fstype, c.opts, got, c.want)
		}
	}
	if got, err := ShmDirPages(t.TempDir()); err != nil || (got != "4KiB" && got != "2MiB") {
		t.Fatalf("ShmDirPages(temp dir) = %q, %v", got, err)
	}
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ShmDirPages(f); !errors.Is(err, ErrRegion) || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("ShmDirPages(a file) = %v, want ErrRegion: not a directory", err)
	}
}

// testCreatedRegionShared checks a region connexd created (r, of layout l
// and memory kind memory): an engine maps it through its path, both
// mappings see each other's writes, and the engine's outlives connexd's.
func testCreatedRegionShared(t *testing.T, r *Region, l Layout, memory string) {
	t.Helper()
	defer r.Close()
	if r.Memory != memory || !strings.HasPrefix(r.Path, "/proc/") {
		t.Fatalf("memory %q path %q", r.Memory, r.Path)
	}
	eng, err := AttachRegion(r.Path, l)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	eng.Block(1, 1, 7)[5] = 0xAB
	if r.Block(1, 1, 7)[5] != 0xAB {
		t.Fatal("connexd's mapping does not see the engine's write")
	}
	r.Block(0, 0, 0)[0] = 0xCD
	if eng.Block(0, 0, 0)[0] != 0xCD {
		t.Fatal("the engine's mapping does not see connexd's write")
	}
	// A layout larger than the file is refused; a smaller one maps.
	big := l
	big.Blocks *= 2
	if _, err := AttachRegion(r.Path, big); !errors.Is(err, ErrBadLayout) {
		t.Fatalf("attach with a larger layout: %v, want ErrBadLayout", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	// The engine's mapping outlives connexd's.
	if eng.Block(1, 1, 7)[5] != 0xAB {
		t.Fatal("the engine lost its memory when connexd closed the region")
	}
}

// Reserving more shared memory than the machine has fails up front with a
// clear error, instead of SIGBUS at first touch (and without taking the
// memory first: the check happens before fallocate).
func TestMemfdRegionTooLargeFailsClearly(t *testing.T) {
	l := Layout{Layers: 1024, Planes: 2, Blocks: 1 << 10, BlockBytes: 1 << 19, BlockSize: 16, TPSize: 1} // 1 TiB
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	_, err := CreateMemfdRegion("huge", l)
	if !errors.Is(err, ErrRegion) || !strings.Contains(err.Error(), "not enough shared memory") {
		t.Fatalf("1 TiB memfd region: %v", err)
	}
}
