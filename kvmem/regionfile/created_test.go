package regionfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/connex/connex/kvmem"
)

// A memfd region is mapped by another "engine" through its path, both
// mappings see each other's writes, and nothing is left in the file system.
func TestMemfdRegionSharedThroughPath(t *testing.T) {
	l := kvmem.Layout{Layers: 2, Planes: 2, Blocks: 8, BlockBytes: 4096, BlockSize: 16, TPSize: 1}
	r, err := CreateMemfd("test", l)
	if err != nil {
		t.Fatal(err)
	}
	// Sealed: nobody who opens its path can shrink (or grow) it.
	for _, size := range []int64{4096, int64(l.Size()) * 2} {
		if err := os.Truncate(r.Path, size); err == nil {
			t.Fatalf("truncating the created memfd to %d bytes succeeded; it must be sealed", size)
		}
	}
	testCreatedRegionShared(t, r, l, kvmem.MemoryMemfd)
}

// A region in shm_dir behaves as a memfd one and leaves no file in the
// directory, even while it is live.
func TestShmRegionSharedThroughPath(t *testing.T) {
	dir := t.TempDir()
	l := kvmem.Layout{Layers: 2, Planes: 2, Blocks: 8, BlockBytes: 4096, BlockSize: 16, TPSize: 1}
	r, err := CreateShm(dir, "test", l)
	if err != nil {
		t.Skipf("the file system of %s has no unnamed files (O_TMPFILE): %v", dir, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("shm_dir holds %d files while the region is live, want none", len(ents))
	}
	testCreatedRegionShared(t, r, l, kvmem.MemoryShm)
	if _, err := CreateShm(filepath.Join(dir, "missing"), "test", l); !errors.Is(err, kvmem.ErrRegion) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("region in a missing shm_dir: %v, want ErrRegion naming the directory", err)
	}
}

// testCreatedRegionShared checks a region connexd created (r, of layout l
// and memory kind memory): an engine maps it through its path, both
// mappings see each other's writes, and the engine's outlives connexd's.
func testCreatedRegionShared(t *testing.T, r *kvmem.Region, l kvmem.Layout, memory string) {
	t.Helper()
	defer r.Close()
	if r.Memory != memory || !strings.HasPrefix(r.Path, "/proc/") {
		t.Fatalf("memory %q path %q", r.Memory, r.Path)
	}
	eng, err := Attach(r.Path, l)
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
	if _, err := Attach(r.Path, big); !errors.Is(err, kvmem.ErrBadLayout) {
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
	l := kvmem.Layout{Layers: 1024, Planes: 2, Blocks: 1 << 10, BlockBytes: 1 << 19, BlockSize: 16, TPSize: 1} // 1 TiB
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	_, err := CreateMemfd("huge", l)
	if !errors.Is(err, kvmem.ErrRegion) || !strings.Contains(err.Error(), "not enough shared memory") {
		t.Fatalf("1 TiB memfd region: %v", err)
	}
}
