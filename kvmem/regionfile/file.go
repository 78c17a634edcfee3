package regionfile

import (
	"fmt"
	"os"
	"syscall"

	"github.com/connex/connex/kvmem"
)

// Create creates (or truncates) a region file at path sized for layout
// and maps it. Engines (and tests playing an engine) call it; connexd
// only opens regions.
func Create(path string, layout kvmem.Layout) (*kvmem.Region, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: create %s: %w", kvmem.ErrRegion, path, err)
	}
	defer f.Close()
	if err := f.Truncate(int64(layout.Size())); err != nil {
		return nil, fmt.Errorf("%w: size %s to %d bytes: %w", kvmem.ErrRegion, path, layout.Size(), err)
	}
	return mapFile(f, path, layout)
}

// Open maps an existing region file, unconfined: connexd opens engines'
// files through a Dir; kvmem.RegionOpenerFunc(Open) gives a RegionTable
// that maps any file (tests). The file must be exactly layout.Size()
// bytes, so a layout that disagrees with the engine's is caught here
// rather than by reading the wrong bytes.
func Open(path string, layout kvmem.Layout) (*kvmem.Region, error) {
	return openSized(path, layout, true)
}

// Attach maps a region connexd created (RegionInfo.path of
// region.create), as an engine does. The file may be larger than the
// layout (allocators round up to pages); only layout.Size() bytes are
// mapped.
func Attach(path string, layout kvmem.Layout) (*kvmem.Region, error) {
	return openSized(path, layout, false)
}

// AttachFile is Attach for a descriptor connexd handed over (the region
// socket, kvmem/handover) instead of a path; name says what it is in
// errors and is the Region's Path. The caller closes f afterwards: the
// mapping keeps the memory.
func AttachFile(f *os.File, name string, layout kvmem.Layout) (*kvmem.Region, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	return mapSized(f, name, layout, false)
}

// openSized maps the first layout.Size() bytes of the file at path. exact
// (an engine's region file) wants a regular file of exactly that size;
// otherwise (connexd's allocation, rounded up) it may be larger.
func openSized(path string, layout kvmem.Layout, exact bool) (*kvmem.Region, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: open %s: %w", kvmem.ErrRegion, path, err)
	}
	defer f.Close()
	return mapSized(f, path, layout, exact)
}

// mapSized is openSized for the open file f (named path in errors).
func mapSized(f *os.File, path string, layout kvmem.Layout, exact bool) (*kvmem.Region, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: stat %s: %w", kvmem.ErrRegion, path, err)
	}
	if exact && !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file", kvmem.ErrRegion, path)
	}
	if size := uint64(st.Size()); size < layout.Size() || exact && size != layout.Size() {
		return nil, fmt.Errorf("%w: %s is %d bytes but the layout needs %d", kvmem.ErrBadLayout, path, st.Size(), layout.Size())
	}
	return mapFile(f, path, layout)
}

// mapFile maps layout.Size() bytes of f shared, as a region of memory
// kind kvmem.MemoryFile that Close unmaps.
func mapFile(f *os.File, path string, layout kvmem.Layout) (*kvmem.Region, error) {
	mem, err := mmap(f, path, layout.Size())
	if err != nil {
		return nil, err
	}
	return kvmem.NewRegion(path, layout, kvmem.MemoryFile, mem, func() error { return syscall.Munmap(mem) })
}

// mmap maps the first n bytes of f shared, read-write.
func mmap(f *os.File, path string, n uint64) ([]byte, error) {
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(n), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%w: mmap %s: %w", kvmem.ErrRegion, path, err)
	}
	return mem, nil
}
