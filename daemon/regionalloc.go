package daemon

import (
	"log/slog"

	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/regionfile"
	"github.com/connex/connex/transport"
)

// regionAllocator allocates created regions' memory: the data plane's
// shared memory when it can (Caps.Allocate), else a file in shm_dir, else
// a memfd.
type regionAllocator struct {
	backend transport.Backend
	shmDir  string
	log     *slog.Logger
}

var _ regionMaker = regionAllocator{}

// newRegion allocates memory for a created region.
func (a regionAllocator) newRegion(name string, l kvmem.Layout) (*kvmem.Region, error) {
	if a.backend.Caps().Allocate {
		al, err := transport.Promised[transport.Allocator](a.backend, "Allocate")
		var mem transport.Allocation
		if err == nil {
			mem, err = al.Allocate(int(l.Size()))
		}
		if err == nil {
			// UCX commits the memory when it allocates (Allocate checks
			// the room in /dev/shm, which containers often keep small;
			// a memfd is not bound by it).
			reg, rerr := kvmem.NewRegion(mem.Path(), l, kvmem.MemoryAllocated(a.backend.Name()), mem.Bytes(), mem.Free)
			if rerr == nil {
				regionfile.Populate(mem.Bytes()[:l.Size()])
				return reg, nil
			}
			_ = mem.Free()
			err = rerr
		}
		a.log.Warn("data plane cannot allocate shared memory; using a memfd, which peers read through the holder",
			"backend", a.backend.Name(), "err", err)
	}
	if a.shmDir != "" {
		return regionfile.CreateShm(a.shmDir, name, l)
	}
	return regionfile.CreateMemfd(name, l)
}
