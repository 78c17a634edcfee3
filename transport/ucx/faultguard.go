//go:build ucx && cgo

package ucx

/*
#include "faultguard.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/connex/connex/transport"
)

// The fault guard (transport.FaultGuard). UCX copies registered memory in
// C: a holder's checked replies, a reader's copy of a reply into its
// destination, ucp_get_nbx from a mapped segment. When the file behind
// such memory shrank (an engine truncated its region, or the shared memory
// connexd created for it, which UCX's POSIX segments cannot be sealed
// against), the copy raises SIGBUS, and a SIGBUS in C code kills a Go
// process. The first Open installs a SIGBUS handler (faultguard.c) that,
// for a fault of kind BUS_ADRERR (no page behind a file mapping), maps
// zeroed anonymous memory over the page, or over the whole range when a
// guarded range holds it, counts the fault and returns: the copy carries
// on, reading or writing zeros. What faulted is then refused:
//
//   - a holder touches every page of a checked GET's source before UCX
//     copies it (one load per page) and refuses the GET with CX_ERR_FAULT
//     (transport.ErrFault at the reader) when it faults, or when its
//     guarded range already broke;
//   - a reader's Get fails with transport.ErrFault when a fault counted
//     during it lay in a destination (or, for mapped segments, when any
//     fault happened during it);
//   - connexd guards every region mapping (Guard) and drops a broken one.
//
// Other SIGBUS (misaligned access, hardware memory errors) go to the
// handler that was installed before, Go's. A truncation that lands between
// a holder's touch and UCX's copy (microseconds) still sends zeros as a
// good reply: the region is refused from then on, and the puller's
// PullEnd, where it waits for it, fails the pull.

var (
	fgOnce sync.Once
	fgErr  error
	fgMu   sync.Mutex // serialises cx_fg_add and cx_fg_del
)

// installFaultGuard installs the SIGBUS handler, once per process.
func installFaultGuard() error {
	fgOnce.Do(func() {
		if e := C.cx_fg_install(); e != 0 {
			fgErr = fmt.Errorf("ucx: install the SIGBUS guard: %w", syscall.Errno(e))
		}
	})
	return fgErr
}

// Guard watches mem, the mapping of one region (transport.FaultGuard).
func (b *Backend) Guard(mem []byte) (transport.Guarded, error) {
	if len(mem) == 0 {
		return nil, errors.New("ucx: guard an empty range")
	}
	if err := installFaultGuard(); err != nil {
		return nil, err
	}
	fgMu.Lock()
	slot := C.cx_fg_add(C.uintptr_t(uintptr(unsafe.Pointer(unsafe.SliceData(mem)))), C.size_t(len(mem)))
	fgMu.Unlock()
	if slot < 0 {
		return nil, errors.New("ucx: the fault guard's table is full (1024 regions)")
	}
	return &guard{slot: slot}, nil
}

// guard is one slot of the handler's table.
type guard struct {
	mu       sync.Mutex
	slot     C.int
	released bool
	broke    bool // Broken at Release
}

func (g *guard) Broken() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.released {
		return g.broke
	}
	return C.cx_fg_broken(g.slot) != 0
}

func (g *guard) Release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.released {
		return
	}
	g.broke = C.cx_fg_broken(g.slot) != 0
	g.released = true
	fgMu.Lock()
	C.cx_fg_del(g.slot)
	fgMu.Unlock()
}

// faults is the number of faults the handler survived so far.
func faults() uint64 { return uint64(C.cx_fg_count()) }

// faultedDuring fails a Get that started when faults() was since and
// otherwise succeeded, when a fault during it hit one of its destinations,
// or when its keys are mapped segments here (mapped says so) and any fault
// happened: the copy then read zeros from a segment whose file shrank.
func faultedDuring(since uint64, ops []transport.GetOp, mapped bool) error {
	if faults() == since {
		return nil
	}
	if mapped {
		return fmt.Errorf("%w: a mapped segment or a destination faulted during the Get", transport.ErrFault)
	}
	for i := range ops {
		d := ops[i].Dst
		if len(d) == 0 {
			continue
		}
		if C.cx_fg_hit(C.uint64_t(since), C.uintptr_t(uintptr(unsafe.Pointer(unsafe.SliceData(d)))), C.size_t(len(d))) != 0 {
			return fmt.Errorf("%w: the destination of op %d faulted", transport.ErrFault, i)
		}
	}
	return nil
}
