package kvmem

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrRegion is returned when a region file cannot be created, opened or mapped.
var ErrRegion = errors.New("kvmem: region")

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
// file, or memory connexd allocated for an engine, which maps Path.
type Region struct {
	Path   string
	Layout Layout
	// Memory says where the memory comes from: MemoryFile, MemoryMemfd, or
	// what NewRegion was given (connexd: MemoryAllocated).
	Memory string
	mem    []byte
	free   func() error // releases mem; nil: munmap
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
	return &Region{Path: path, Layout: layout, Memory: MemoryFile, mem: mem}, nil
}

// NewRegion wraps memory allocated elsewhere (a data plane's Allocator) as
// a region: mem must be at least layout.Size() bytes and stay valid until
// Close, which calls free. path is what the engine maps.
func NewRegion(path string, layout Layout, memory string, mem []byte, free func() error) (*Region, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	if uint64(len(mem)) < layout.Size() {
		return nil, fmt.Errorf("%w: %d bytes of memory for a %d-byte layout", ErrRegion, len(mem), layout.Size())
	}
	return &Region{Path: path, Layout: layout, Memory: memory, mem: mem[:layout.Size():layout.Size()], free: free}, nil
}

// CreateMemfdRegion creates an anonymous shared-memory region (memfd) for
// layout, named name (shown in /proc/<pid>/fd), sealed against resizing.
// Its Path,
// /proc/<pid>/fd/<n>, is what an engine of this host maps; the memory lives
// until Close and the last mapping are gone, and nothing is left behind in
// the file system if this process dies.
func CreateMemfdRegion(name string, layout Layout) (*Region, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("connex-"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("%w: memfd_create: %w", ErrRegion, err)
	}
	r, err := createdRegion(os.NewFile(uintptr(fd), "memfd:connex-"+name), layout, MemoryMemfd)
	if err != nil {
		return nil, err
	}
	// Sealed against resizing: an engine that maps it (read-write, through
	// /proc) cannot shrink it under a pull, which would fault connexd.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("%w: seal the memfd against resizing: %w", ErrRegion, err)
	}
	return r, nil
}

// CreateShmRegion is CreateMemfdRegion with the memory in directory dir
// (shm_dir): an unnamed file there (O_TMPFILE), so that the file system's
// page size applies — a tmpfs mounted with huge=always gives 2 MiB pages,
// which make first touch, copies and the unmapping at process exit one to
// two orders of magnitude cheaper than 4 KiB pages for GiB regions. As
// with a memfd, nothing is left in dir when the process dies.
func CreateShmRegion(dir, name string, layout Layout) (*Region, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: shm_dir %s: unnamed file (O_TMPFILE): %w", ErrRegion, dir, err)
	}
	return createdRegion(os.NewFile(uintptr(fd), "shm:"+dir+"/connex-"+name), layout, MemoryShm)
}

// createdRegion reserves, maps and populates f, an unnamed file this
// process made, as a region of layout; the region owns f.
func createdRegion(f *os.File, layout Layout, memory string) (*Region, error) {
	if err := reserve(f, layout.Size()); err != nil {
		f.Close()
		return nil, err
	}
	path := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd())
	r, err := mapFile(f, path, layout)
	if err != nil {
		f.Close()
		return nil, err
	}
	Populate(r.mem)
	mem := r.mem
	r.Memory = memory
	r.free = func() error {
		err := syscall.Munmap(mem)
		return errors.Join(err, f.Close())
	}
	return r, nil
}

// Populate faults in every page of mem, writable, without changing its
// bytes (MADV_POPULATE_WRITE, Linux 5.14; elsewhere it does nothing). A
// created region's memory is then allocated and zeroed at region.create,
// where its cost belongs, instead of on the first pull that writes each
// page (on a VM, the first touch of guest memory costs several times a
// copy: measured 35 ms extra on a 128 MiB pull).
func Populate(mem []byte) {
	if len(mem) > 0 {
		_ = unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
	}
}

// Reserve allocates n bytes of the shared-memory file at path up front
// (fallocate), so that a region larger than the memory left fails here with
// a clear error instead of with SIGBUS in the engine that first touches a
// page it cannot get.
func Reserve(path string, n uint64) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("%w: open %s: %w", ErrRegion, path, err)
	}
	defer f.Close()
	return reserve(f, n)
}

func reserve(f *os.File, n uint64) error {
	// fallocate on a file system without a size limit (memfd's) takes
	// pages until memory runs out, so check the room first.
	if room, err := roomFor(f); err == nil && n > room {
		return fmt.Errorf("%w: not enough shared memory for %d bytes (%s): %d available", ErrRegion, n, f.Name(), room)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(n)); err != nil {
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) {
			return fmt.Errorf("%w: not enough shared memory for %d bytes (%s): %w", ErrRegion, n, f.Name(), err)
		}
		return fmt.Errorf("%w: reserve %d bytes of %s: %w", ErrRegion, n, f.Name(), err)
	}
	return nil
}

// roomFor is how many bytes f's file system can still give: its free
// space, or, when it has no size limit (memfd), the memory the kernel
// reports available.
func roomFor(f *os.File) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	if st.Blocks > 0 {
		return st.Bavail * uint64(st.Bsize), nil
	}
	return Meminfo("MemAvailable")
}

// Meminfo reads one field of /proc/meminfo (e.g. "MemTotal"), in bytes.
func Meminfo(field string) (uint64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/meminfo", field)
}

// AttachRegion maps a region connexd created (RegionInfo.path of
// region.create), as an engine does. The file may be larger than the
// layout (allocators round up to pages); only layout.Size() bytes are
// mapped.
func AttachRegion(path string, layout Layout) (*Region, error) {
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
	if uint64(st.Size()) < layout.Size() {
		return nil, fmt.Errorf("%w: %s is %d bytes but the layout needs %d", ErrBadLayout, path, st.Size(), layout.Size())
	}
	return mapFile(f, path, layout)
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

// Close unmaps the region, or frees memory connexd allocated for it. It
// is idempotent. An engine's file stays: it belongs to the engine.
func (r *Region) Close() error {
	if r.mem == nil {
		return nil
	}
	var err error
	if r.free != nil {
		err = r.free()
	} else {
		err = syscall.Munmap(r.mem)
	}
	r.mem = nil
	if err != nil {
		return fmt.Errorf("%w: munmap %s: %w", ErrRegion, r.Path, err)
	}
	return nil
}
