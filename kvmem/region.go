package kvmem

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ErrRegion is returned when a region file cannot be created, opened or mapped.
var ErrRegion = errors.New("kvmem: region")

// Region is a KV region file mapped shared into this process.
type Region struct {
	Path   string
	Layout Layout
	mem    []byte
}

// CreateRegion creates (or truncates) a region file at path sized for
// layout and maps it. Engines (and tests playing an engine) call it; connexd
// only opens regions.
func CreateRegion(path string, layout Layout) (*Region, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: create %s: %w", ErrRegion, path, err)
	}
	defer f.Close()
	if err := f.Truncate(int64(layout.Size())); err != nil {
		return nil, fmt.Errorf("%w: size %s to %d bytes: %w", ErrRegion, path, layout.Size(), err)
	}
	return mapFile(f, path, layout)
}

// OpenRegion maps an existing region file. The file must be exactly
// layout.Size() bytes, so a layout that disagrees with the engine's is caught
// here rather than by reading the wrong bytes.
func OpenRegion(path string, layout Layout) (*Region, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: open %s: %w", ErrRegion, path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: stat %s: %w", ErrRegion, path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrRegion, path)
	}
	if uint64(st.Size()) != layout.Size() {
		return nil, fmt.Errorf("%w: %s is %d bytes but the layout needs %d", ErrBadLayout, path, st.Size(), layout.Size())
	}
	return mapFile(f, path, layout)
}

func mapFile(f *os.File, path string, layout Layout) (*Region, error) {
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(layout.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%w: mmap %s: %w", ErrRegion, path, err)
	}
	return &Region{Path: path, Layout: layout, mem: mem}, nil
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

// Close unmaps the region. It is idempotent. The file stays: it belongs to
// the engine.
func (r *Region) Close() error {
	if r.mem == nil {
		return nil
	}
	err := syscall.Munmap(r.mem)
	r.mem = nil
	if err != nil {
		return fmt.Errorf("%w: munmap %s: %w", ErrRegion, r.Path, err)
	}
	return nil
}
