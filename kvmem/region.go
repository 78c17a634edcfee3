package kvmem

import (
	"errors"
	"fmt"
)

// ErrRegion is returned when a region file cannot be created, opened or
// mapped (kvmem/regionfile wraps it), or its memory cannot be released.
var ErrRegion = errors.New("kvmem: region")

// ErrOutsideRegionDir refuses a region.register path that is not a
// regular file beneath region_dir, owned by an allowed user
// (regionfile.Dir wraps it). Its messages say nothing about what lies
// outside the directory.
var ErrOutsideRegionDir = errors.New("kvmem: region file refused")

// Memory kinds of a Region (RegionInfo.memory).
const (
	// MemoryFile is an engine's region file (region.register).
	MemoryFile = "file"
	// MemoryMemfd is a memfd connexd created (region.create without an
	// allocating data plane).
	MemoryMemfd = "memfd"
	// MemoryShm is an unnamed file connexd created in shm_dir
	// (region.create with shm_dir set and no data-plane allocator).
	MemoryShm = "shm"
)

// MemoryAllocated is the Memory kind of a region whose memory the data-plane
// backend named backend allocated (transport.Allocator): "<backend>-shared".
// Registrations on such memory follow the backend's rules for its own
// allocations (transport.Caps.OneKeyForExtents).
func MemoryAllocated(backend string) string { return backend + "-shared" }

// Region is KV memory mapped shared into this process: an engine's region
// file, or memory connexd allocated for an engine, which maps Path. It is
// only bytes laid out by Layout and the func that releases them; the
// package kvmem/regionfile makes regions from files, a data plane's
// Allocator from its own memory (NewRegion).
type Region struct {
	Path   string
	Layout Layout
	// Memory says where the memory comes from: MemoryFile, MemoryMemfd,
	// MemoryShm, or what NewRegion was given (connexd: MemoryAllocated).
	Memory string
	mem    []byte
	free   func() error // releases mem (munmap, an allocator's free); nil: nothing to release
}

// NewRegion wraps memory mapped or allocated elsewhere as a region: mem
// must be at least layout.Size() bytes and stay valid until Close, which
// calls free (nil: the memory needs no release, e.g. a test's heap bytes).
// path is what the engine maps; memory is the Region's Memory.
func NewRegion(path string, layout Layout, memory string, mem []byte, free func() error) (*Region, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	if uint64(len(mem)) < layout.Size() {
		return nil, fmt.Errorf("%w: %d bytes of memory for a %d-byte layout", ErrRegion, len(mem), layout.Size())
	}
	return &Region{Path: path, Layout: layout, Memory: memory, mem: mem[:layout.Size():layout.Size()], free: free}, nil
}

// Bytes is the whole mapped region. It is valid until Close.
func (r *Region) Bytes() []byte { return r.mem }

// Slice is the mapped bytes of one extent.
func (r *Region) Slice(e Extent) []byte { return r.mem[e.Off : e.Off+e.Len : e.Off+e.Len] }

// Block is the mapped bytes of block b of plane p of layer layer.
func (r *Region) Block(layer, plane, b uint32) []byte {
	off := r.Layout.Offset(layer, plane, b)
	return r.mem[off : off+r.Layout.BlockBytes : off+r.Layout.BlockBytes]
}

// Close releases the region's memory (unmaps it, or frees what connexd
// allocated for it). It is idempotent. An engine's file stays: it belongs
// to the engine.
func (r *Region) Close() error {
	if r.mem == nil {
		return nil
	}
	var err error
	if r.free != nil {
		err = r.free()
	}
	r.mem = nil
	if err != nil {
		return fmt.Errorf("%w: munmap %s: %w", ErrRegion, r.Path, err)
	}
	return nil
}
