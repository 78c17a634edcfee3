package regionfile

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/connex/connex/kvmem"
	"golang.org/x/sys/unix"
)

// CreateMemfd creates an anonymous shared-memory region (memfd) for
// layout, named name (shown in /proc/<pid>/fd), sealed against resizing.
// Its Path, /proc/<pid>/fd/<n>, is what connexd opens to hand the
// descriptor to an engine (kvmem/handover; an engine of connexd's own uid
// may Attach the path itself); the memory lives until Close and the last mapping are gone,
// and nothing is left behind in the file system if this process dies.
func CreateMemfd(name string, layout kvmem.Layout) (*kvmem.Region, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("connex-"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("%w: memfd_create: %w", kvmem.ErrRegion, err)
	}
	r, err := created(os.NewFile(uintptr(fd), "memfd:connex-"+name), layout, kvmem.MemoryMemfd)
	if err != nil {
		return nil, err
	}
	// Sealed against resizing: an engine that maps it (read-write, through
	// /proc) cannot shrink it under a pull, which would fault connexd.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("%w: seal the memfd against resizing: %w", kvmem.ErrRegion, err)
	}
	return r, nil
}

// CreateShm is CreateMemfd with the memory in directory dir (shm_dir): an
// unnamed file there (O_TMPFILE), so that the file system's page size
// applies — a tmpfs mounted with huge=always gives 2 MiB pages, which
// make first touch, copies and the unmapping at process exit one to two
// orders of magnitude cheaper than 4 KiB pages for GiB regions. As with a
// memfd, nothing is left in dir when the process dies.
func CreateShm(dir, name string, layout kvmem.Layout) (*kvmem.Region, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: shm_dir %s: unnamed file (O_TMPFILE): %w", kvmem.ErrRegion, dir, err)
	}
	return created(os.NewFile(uintptr(fd), "shm:"+dir+"/connex-"+name), layout, kvmem.MemoryShm)
}

// created reserves, maps and populates f, an unnamed file this process
// made, as a region of layout and memory kind memory; the region owns f
// (Close unmaps it and closes f).
func created(f *os.File, layout kvmem.Layout, memory string) (*kvmem.Region, error) {
	if err := reserve(f, layout.Size()); err != nil {
		f.Close()
		return nil, err
	}
	path := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd())
	mem, err := mmap(f, path, layout.Size())
	if err != nil {
		f.Close()
		return nil, err
	}
	Populate(mem)
	return kvmem.NewRegion(path, layout, memory, mem, func() error {
		err := syscall.Munmap(mem)
		return errors.Join(err, f.Close())
	})
}
