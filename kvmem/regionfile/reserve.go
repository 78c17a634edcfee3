package regionfile

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/connex/connex/kvmem"
	"golang.org/x/sys/unix"
)

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
		return fmt.Errorf("%w: open %s: %w", kvmem.ErrRegion, path, err)
	}
	defer f.Close()
	return reserve(f, n)
}

func reserve(f *os.File, n uint64) error {
	// fallocate on a file system without a size limit (memfd's) takes
	// pages until memory runs out, so check the room first.
	if room, err := roomFor(f); err == nil && n > room {
		return fmt.Errorf("%w: not enough shared memory for %d bytes (%s): %d available", kvmem.ErrRegion, n, f.Name(), room)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(n)); err != nil {
		if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) {
			return fmt.Errorf("%w: not enough shared memory for %d bytes (%s): %w", kvmem.ErrRegion, n, f.Name(), err)
		}
		return fmt.Errorf("%w: reserve %d bytes of %s: %w", kvmem.ErrRegion, n, f.Name(), err)
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
