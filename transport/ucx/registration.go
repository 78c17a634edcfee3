//go:build ucx && cgo

package ucx

/*
#cgo pkg-config: ucx
#include <stdlib.h>
#include "cx.h"
*/
import "C"

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"github.com/connex/connex/transport"
)

// Registration is memory mapped with ucp_mem_map. Its remote key covers
// exactly [RemoteAddr, RemoteAddr+Len).
type Registration struct {
	b    *Backend
	memh C.ucp_mem_h
	ptr  unsafe.Pointer // first registered byte
	base uintptr
	n    int
	key  []byte // RMA and onesided keys; checked and shared keys are packed per RemoteKey
	// regID and token name a checked registration in its key, and
	// keyAlloc the allocation a shared key names (shared, which Deregister
	// clears, at the time it was made): kept rather than the packed key
	// (~110 bytes a hold: make bench-holds).
	regID, token uint64
	keyAlloc     *Allocation
	alloc        bool      // UCX allocated the memory (Alloc)
	rma          bool      // raw RMA key: Alloc, or Register in onesided mode
	creg         *C.cx_reg // checked registrations: the holder's table entry
	// shared is the allocation a checked registration lies in (its key is
	// a shared key); nil otherwise.
	shared *Allocation
	pin    runtime.Pinner
	gone   bool           // under b.mu
	src    unsafe.Pointer // the caller's memory to map (nil: UCX allocates)
}

var _ transport.Registration = (*Registration)(nil)

// Register maps mem (Go or mmap'd memory) with ucp_mem_map. In checked mode
// it enters mem in the holder's registration table and hands out a checked
// key; in onesided mode it packs UCX's rkey into the key, and readers GET
// with ucp_get_nbx. mem stays pinned until Deregister or Close.
func (b *Backend) Register(mem []byte) (transport.Registration, error) {
	if len(mem) == 0 {
		return nil, fmt.Errorf("ucx: register: empty memory")
	}
	return b.register(mem, nil, b.cfg.Reads == ReadsOneSided)
}

// RegisterExtents exposes only the given extents of mem under one key
// (transport.ExtentRegistrar): the holder's request handler checks every
// read against the sorted extent list. A onesided key is read without the
// holder, so it cannot restrict reads to extents: in onesided mode
// RegisterExtents fails with errors.ErrUnsupported, except on memory from
// Allocate, which always gets a shared key. Caps says so beforehand
// (ExtentKeys false, AllocationExtentKeys true): callers decide from it and
// register extent by extent instead.
func (b *Backend) RegisterExtents(mem []byte, extents []transport.Extent) (transport.Registration, error) {
	if len(mem) == 0 || len(extents) == 0 {
		return nil, fmt.Errorf("ucx: register extents: empty memory or extent list")
	}
	if err := transport.ValidateExtents(extents, uint64(len(mem))); err != nil {
		return nil, fmt.Errorf("ucx: register: %w", err)
	}
	// The holder checks each read against a single extent, and this
	// backend's readers join adjacent ops (runsOf): join adjacent extents.
	joined := transport.JoinAdjacent(extents)
	pairs := make([]uint64, 0, 2*len(joined))
	for _, e := range joined {
		pairs = append(pairs, e.Off, e.Len)
	}
	return b.register(mem, pairs, b.cfg.Reads == ReadsOneSided)
}

// register maps mem: with a shared key when it lies in an allocation from
// Allocate, else with a onesided key (onesided, no extents) or a checked
// key restricted to extents.
func (b *Backend) register(mem []byte, extents []uint64, onesided bool) (transport.Registration, error) {
	r, err := b.newReg(mem, extents, onesided)
	if err != nil {
		return nil, err
	}
	if err := b.mapMany([]*Registration{r}, [][]uint64{extents}); err != nil {
		r.release()
		return nil, err
	}
	return r, nil
}

// RegisterMany registers each of mems as Register does, in one hand-off to
// the worker thread: a scattered hold registers one onesided key per
// extent, tens of thousands, which one by one took seconds
// (transport.ManyRegisterer). On error none stays registered.
func (b *Backend) RegisterMany(mems [][]byte) ([]transport.Registration, error) {
	rs := make([]*Registration, 0, len(mems))
	undo := func() {
		for _, r := range rs {
			r.release()
		}
	}
	for i, mem := range mems {
		if len(mem) == 0 {
			undo()
			return nil, fmt.Errorf("ucx: register memory %d of %d: empty", i, len(mems))
		}
		r, err := b.newReg(mem, nil, b.cfg.Reads == ReadsOneSided)
		if err != nil {
			undo()
			return nil, err
		}
		rs = append(rs, r)
	}
	if err := b.mapMany(rs, make([][]uint64, len(rs))); err != nil {
		undo()
		return nil, err
	}
	out := make([]transport.Registration, len(rs))
	for i, r := range rs {
		out[i] = r
	}
	return out, nil
}

// newReg is an unmapped registration of mem with mem pinned: what kind of
// key it gets follows register.
func (b *Backend) newReg(mem []byte, extents []uint64, onesided bool) (*Registration, error) {
	b.mu.Lock()
	a := b.allocFor(mem)
	b.mu.Unlock()
	r := &Registration{b: b, n: len(mem), rma: a == nil && onesided, shared: a, src: unsafe.Pointer(&mem[0])}
	if a == nil && onesided && extents != nil {
		r.dropView()
		return nil, fmt.Errorf("ucx: extents under one key need checked reads: %w", errors.ErrUnsupported)
	}
	if a == nil {
		// Memory UCX allocated is not Go's: nothing to pin, and a Pinner
		// costs an object and a finalizer (~100 bytes a live hold).
		r.pin.Pin(&mem[0])
	}
	return r, nil
}

// release undoes newReg for a registration that was never mapped.
func (r *Registration) release() {
	r.pin.Unpin()
	r.dropView()
}

// dropView releases r's view on its allocation, once.
func (r *Registration) dropView() {
	if r.shared == nil {
		return
	}
	r.b.mu.Lock()
	r.shared.views--
	r.b.mu.Unlock()
	r.shared = nil
}

// Alloc has UCX allocate n bytes (UCP_MEM_MAP_ALLOCATE) and registers them
// with a raw RMA key: readers use ucp_get_nbx, which on shared memory is
// truly one-sided (no holder CPU). Bytes returns the memory.
//
// Experimental: an RMA key is not revocable and UCX does not check it on
// emulated transports (TCP), so after Deregister the memory stays mapped,
// and readable by peers that kept the key, until the Backend closes.
// Registrations made with Register do not have this problem.
func (b *Backend) Alloc(n int) (*Registration, error) {
	if n <= 0 {
		return nil, fmt.Errorf("ucx: alloc: bad size %d", n)
	}
	r := &Registration{b: b, n: n, alloc: true, rma: true}
	if err := b.mapMem(r, nil); err != nil {
		return nil, err
	}
	return r, nil
}

// mapMem maps r (ucp_mem_map of r.src, or of memory UCX allocates when
// r.src is nil) and gives it its key; see mapMany.
func (b *Backend) mapMem(r *Registration, extents []uint64) error {
	return b.mapMany([]*Registration{r}, [][]uint64{extents})
}

// mapMany maps every registration of rs (extents[i] restricts rs[i]'s
// checked key) in one call on the worker thread, and enters them in the
// backend's table. On error none stays mapped.
func (b *Backend) mapMany(rs []*Registration, extents [][]uint64) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return transport.ErrClosed
	}
	b.mu.Unlock()
	tokens := make([]uint64, len(rs))
	for i, r := range rs {
		if r.rma {
			continue
		}
		var t [8]byte
		if _, err := rand.Read(t[:]); err != nil {
			return err
		}
		tokens[i] = binary.LittleEndian.Uint64(t[:])
	}
	// Onesided keys name this process, so that a reader on the same host
	// can copy with process_vm_readv; without /proc the key is a plain
	// RMA key and readers use ucp_get_nbx.
	proc, procErr := selfProc()
	if procErr != nil && slices.ContainsFunc(rs, func(r *Registration) bool { return r.rma && !r.alloc }) {
		b.log.Warn("ucx: onesided register: cannot identify this process; readers will use ucp_get_nbx", "err", procErr)
	}
	var st C.ucs_status_t
	err := b.w.call(func() {
		for i, r := range rs {
			if st = b.mapOnWorker(r, extents[i], tokens[i], proc, procErr); st != C.UCS_OK {
				for _, done := range rs[:i] {
					_ = b.w.unmap(done)
				}
				return
			}
		}
	})
	if err != nil {
		return err
	}
	if st != C.UCS_OK {
		return statusErr("mem_map", st)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed { // Close ran meanwhile and did not see rs
		b.w.call(func() {
			for _, r := range rs {
				_ = b.w.unmap(r)
			}
		})
		return transport.ErrClosed
	}
	for _, r := range rs {
		b.regs[r] = struct{}{}
	}
	return nil
}

// mapOnWorker maps one registration; it runs on the worker thread.
func (b *Backend) mapOnWorker(r *Registration, extents []uint64, token uint64, proc procID, procErr error) C.ucs_status_t {
	alloc := C.int(0)
	if r.alloc {
		alloc = 1
	}
	var addr, rkey unsafe.Pointer
	var rkeyLen C.size_t
	if r.rma {
		if st := C.cx_mem_map(b.w.c, r.src, C.size_t(r.n), alloc, &r.memh, &addr, &rkey, &rkeyLen); st != C.UCS_OK {
			return st
		}
	} else if st := C.cx_mem_map(b.w.c, r.src, C.size_t(r.n), alloc, &r.memh, &addr, nil, nil); st != C.UCS_OK {
		return st
	}
	r.ptr = addr
	r.base = uintptr(addr)
	if r.rma {
		if r.alloc || procErr != nil {
			r.key = packRMAKey(uint64(r.base), r.n, C.GoBytes(rkey, C.int(rkeyLen)))
		} else {
			r.key = packOneSidedKey(uint64(r.base), r.n, proc, C.GoBytes(rkey, C.int(rkeyLen)))
		}
		C.cx_rkey_buffer_release(rkey)
		return C.UCS_OK
	}
	r.creg = C.cx_reg_add(b.w.c, C.uint64_t(r.base), C.uint64_t(r.n), C.uint64_t(token), r.memh)
	if r.creg == nil {
		C.cx_mem_unmap(b.w.c, r.memh)
		return C.UCS_ERR_NO_MEMORY
	}
	if len(extents) > 0 {
		// Before the key exists no request can name the registration,
		// so restricting it here leaves no window.
		if C.cx_reg_set_extents(r.creg, (*C.uint64_t)(unsafe.Pointer(&extents[0])), C.uint64_t(len(extents)/2)) != 0 {
			C.cx_reg_disable(b.w.c, r.creg)
			C.cx_reg_free(r.creg)
			r.creg = nil
			C.cx_mem_unmap(b.w.c, r.memh)
			return C.UCS_ERR_NO_MEMORY
		}
	}
	r.regID, r.token, r.keyAlloc = uint64(r.creg.id), token, r.shared
	return C.UCS_OK
}

// RemoteKey is the packed key: the registered extent followed by UCX's rkey
// (RMA, onesided), or what names the checked registration (and, for a
// shared key, the allocation it lies in and this process).
func (r *Registration) RemoteKey() []byte {
	switch {
	case r.key != nil:
		return bytes.Clone(r.key)
	case r.keyAlloc != nil:
		// Allocate succeeded only where selfProc did; cached since.
		proc, _ := selfProc()
		return packSharedKey(uint64(r.base), r.n, r.regID, r.token, r.keyAlloc.id, proc, r.keyAlloc.rkey)
	default:
		return packCheckedKey(uint64(r.base), r.n, r.regID, r.token)
	}
}

// RemoteAddr is the virtual address of the first registered byte.
func (r *Registration) RemoteAddr() uint64 { return uint64(r.base) }

// Len is the number of registered bytes.
func (r *Registration) Len() int { return r.n }

// Bytes is the registered memory (for Alloc'd registrations, the only way to
// reach it). Alloc'd memory is valid until the Backend closes.
func (r *Registration) Bytes() []byte {
	return unsafe.Slice((*byte)(r.ptr), r.n)
}

// Deregister revokes the registration and unmaps it (ucp_mem_unmap);
// Alloc'd memory is kept mapped until Close. A onesided registration cannot
// be revoked: a reader that kept the key can still read the memory while the
// caller keeps it mapped (see the package documentation). For checked registrations the holder refuses
// every request from then on, and Deregister waits until replies already
// being sent from this memory have completed (force-closing the endpoints
// they are on after DeregisterGrace), so the caller may reuse the memory
// when it returns nil. Idempotent.
func (r *Registration) Deregister() error {
	return r.b.deregisterAll([]*Registration{r})
}

// DeregisterAll deregisters every registration of regs (all of this
// Backend) as Deregister does one, in a single hand-off to the worker
// thread: a hold of tens of thousands of onesided keys is deregistered in
// one wake-up of the worker instead of one per key, which on a loaded
// two-core machine took seconds (transport.ManyDeregisterer). It returns
// the failures joined.
func (b *Backend) DeregisterAll(regs []transport.Registration) error {
	own := make([]*Registration, 0, len(regs))
	var errs []error
	for _, reg := range regs {
		r, ok := reg.(*Registration)
		if !ok || r.b != b {
			errs = append(errs, fmt.Errorf("ucx: deregister a registration of another backend (%T)", reg))
			continue
		}
		own = append(own, r)
	}
	return errors.Join(append(errs, b.deregisterAll(own))...)
}

// deregisterAll is Deregister for each of regs, one worker call for all.
func (b *Backend) deregisterAll(regs []*Registration) error {
	live := make([]*Registration, 0, len(regs))
	b.mu.Lock()
	for _, r := range regs {
		if r.gone {
			continue
		}
		r.gone = true
		delete(b.regs, r)
		live = append(live, r)
	}
	b.mu.Unlock()
	if len(live) == 0 {
		return nil
	}
	dones := make([]chan error, len(live))
	for i := range dones {
		dones[i] = make(chan error, 1)
	}
	if err := b.w.call(func() {
		for i, r := range live {
			b.w.deregister(r, dones[i])
		}
	}); err != nil {
		return nil // the worker is gone, and with it the mappings
	}
	var errs []error
	for i, r := range live {
		select {
		case err := <-dones[i]:
			if err != nil {
				errs = append(errs, err)
				continue
			}
			r.pin.Unpin()
			r.dropView()
		case <-b.w.done:
			return errors.Join(errs...)
		}
	}
	return errors.Join(errs...)
}
