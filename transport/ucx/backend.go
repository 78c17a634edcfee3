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
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/connex/connex/transport"
)

// Backend is the UCX data plane: one UCP context and worker, owned by one
// goroutine (see the package documentation). It implements
// transport.Backend; all methods are safe for concurrent use.
type Backend struct {
	cfg   Config
	w     *worker
	addr  []byte
	chunk uint64
	tls   string // the transport list in effect

	mu     sync.Mutex
	closed bool
	regs   map[*Registration]struct{}
	eps    map[string]*endpoint
	allocs []*Allocation // live shared allocations (Allocate)

	mappedGets atomic.Int64 // Gets served by mapGet (tests)
}

var _ transport.Backend = (*Backend)(nil)

var (
	availOnce sync.Once
	avail     bool
)

// Available reports whether libucp initialises on this machine (checked once
// per process by opening and closing a Backend).
func Available() bool {
	availOnce.Do(func() {
		b, err := Open(transport.Options{})
		if err == nil {
			avail = true
			b.Close()
		}
	})
	return avail
}

// Open starts a UCX backend with UCX's transports chosen by the environment
// (UCX_TLS) or UCX's defaults.
func Open(opts transport.Options) (*Backend, error) {
	return OpenConfig(Config{Options: opts})
}

// OpenConfig starts a UCX backend configured by cfg.
func OpenConfig(cfg Config) (*Backend, error) {
	reads, err := cfg.reads()
	if err != nil {
		return nil, err
	}
	// Before any memory is registered: UCX's copies of memory whose file
	// shrank must not kill the process (faultguard.go).
	if err := installFaultGuard(); err != nil {
		return nil, err
	}
	cfg.Reads = reads
	if cfg.SharedReads, err = cfg.sharedReads(); err != nil {
		return nil, err
	}
	if cfg.ShmDir != "" {
		if st, err := os.Stat(cfg.ShmDir); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("ucx: shm_dir %s is not a directory (%v)", cfg.ShmDir, err)
		}
		// UCX reads its posix transport's configuration from the
		// environment when the context is created, below.
		if err := os.Setenv("UCX_POSIX_DIR", cfg.ShmDir); err != nil {
			return nil, fmt.Errorf("ucx: shm_dir: %w", err)
		}
	}
	tls := cfg.TLS
	if tls == "" {
		tls = os.Getenv("UCX_TLS")
	}
	set := cfg.TLS
	switch {
	case tls != "":
	case reads == ReadsOneSided:
		// CMA for the GETs, with peer error handling (see
		// OneSidedDefaultTLS).
		tls, set = OneSidedDefaultTLS, OneSidedDefaultTLS
	default:
		// UCX 1.13 aborts the whole process (ucs_fatal) when a CMA copy
		// finds its peer gone and the endpoint has no peer error handling,
		// which shared-memory endpoints cannot have. Leave CMA out unless
		// someone asks for it.
		tls, set = SafeDefaultTLS, SafeDefaultTLS
	}
	log := cfg.Log()
	w, err := startWorker(set, peerErrMode(tls), log.Warn)
	if err != nil {
		return nil, err
	}
	b := &Backend{
		cfg:   cfg,
		w:     w,
		chunk: uint64(cfg.chunk()),
		regs:  map[*Registration]struct{}{},
		eps:   map[string]*endpoint{},
	}
	var st C.ucs_status_t
	if err := w.call(func() {
		var p unsafe.Pointer
		var n C.size_t
		st = C.cx_address(w.c, &p, &n)
		if st == C.UCS_OK {
			b.addr = packAddr(C.GoBytes(p, C.int(n)))
			C.cx_address_release(w.c, p)
		}
	}); err != nil {
		return nil, err
	}
	if st != C.UCS_OK {
		b.Close()
		return nil, statusErr("worker_get_address", st)
	}
	b.tls = tls
	log.Debug("ucx backend open", "tls", tls, "reads", reads, "peer_error_handling", w.errPeer)
	return b, nil
}

// Name is "ucx".
func (b *Backend) Name() string { return "ucx" }

// Caps: in checked mode GETs on registered memory are served by the
// holder's CPU (OneSided false); in onesided mode a reader on the same host
// copies them with process_vm_readv (OneSided true). Ranges are split and
// pipelined internally, so callers pass whole pulls to one Get.
func (b *Backend) Caps() transport.Caps {
	return transport.Caps{OneSided: b.cfg.Reads == ReadsOneSided, MaxInFlight: 0, MaxGetBytes: 0}
}

// Reads is the read mode of memory this Backend registers (ReadsChecked or
// ReadsOneSided).
func (b *Backend) Reads() string { return b.cfg.Reads }

// TLS is the UCX transport list in effect (Config.TLS, UCX_TLS, or the
// mode's default).
func (b *Backend) TLS() string { return b.tls }

// Address is the packed UCP worker address.
func (b *Backend) Address() []byte { return bytes.Clone(b.addr) }

// Registration is memory mapped with ucp_mem_map. Its remote key covers
// exactly [RemoteAddr, RemoteAddr+Len).
type Registration struct {
	b     *Backend
	memh  C.ucp_mem_h
	ptr   unsafe.Pointer // first registered byte
	base  uintptr
	n     int
	key   []byte
	alloc bool      // UCX allocated the memory (Alloc)
	rma   bool      // raw RMA key: Alloc, or Register in onesided mode
	creg  *C.cx_reg // checked registrations: the holder's table entry
	// shared is the allocation a checked registration lies in (its key is
	// a shared key); nil otherwise.
	shared *Allocation
	pin    runtime.Pinner
	gone   bool // under b.mu
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
// RegisterExtents fails with errors.ErrUnsupported (callers register extent
// by extent instead), except on memory from Allocate, which always gets a
// shared key.
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
	b.mu.Lock()
	a := b.allocFor(mem)
	b.mu.Unlock()
	if a == nil && onesided && extents != nil {
		return nil, fmt.Errorf("ucx: extents under one key need checked reads: %w", errors.ErrUnsupported)
	}
	r := &Registration{b: b, n: len(mem), rma: a == nil && onesided, shared: a}
	r.pin.Pin(&mem[0])
	if err := b.mapMem(r, unsafe.Pointer(&mem[0]), extents); err != nil {
		r.pin.Unpin()
		r.dropView()
		return nil, err
	}
	return r, nil
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
	if err := b.mapMem(r, nil, nil); err != nil {
		return nil, err
	}
	return r, nil
}

func (b *Backend) mapMem(r *Registration, p unsafe.Pointer, extents []uint64) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return transport.ErrClosed
	}
	b.mu.Unlock()
	var st C.ucs_status_t
	alloc := C.int(0)
	if r.alloc {
		alloc = 1
	}
	var token uint64
	if !r.rma {
		var t [8]byte
		if _, err := rand.Read(t[:]); err != nil {
			return err
		}
		token = binary.LittleEndian.Uint64(t[:])
	}
	// Onesided keys name this process, so that a reader on the same host
	// can copy with process_vm_readv; without /proc the key is a plain
	// RMA key and readers use ucp_get_nbx.
	proc, procErr := selfProc()
	if r.rma && !r.alloc && procErr != nil {
		b.cfg.Log().Warn("ucx: onesided register: cannot identify this process; readers will use ucp_get_nbx", "err", procErr)
	}
	err := b.w.call(func() {
		var addr, rkey unsafe.Pointer
		var rkeyLen C.size_t
		if r.rma {
			st = C.cx_mem_map(b.w.c, p, C.size_t(r.n), alloc, &r.memh, &addr, &rkey, &rkeyLen)
		} else {
			st = C.cx_mem_map(b.w.c, p, C.size_t(r.n), alloc, &r.memh, &addr, nil, nil)
		}
		if st != C.UCS_OK {
			return
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
			return
		}
		r.creg = C.cx_reg_add(b.w.c, C.uint64_t(r.base), C.uint64_t(r.n), C.uint64_t(token), r.memh)
		if r.creg == nil {
			C.cx_mem_unmap(b.w.c, r.memh)
			st = C.UCS_ERR_NO_MEMORY
			return
		}
		if len(extents) > 0 {
			// Before the key exists no request can name the registration,
			// so restricting it here leaves no window.
			if C.cx_reg_set_extents(r.creg, (*C.uint64_t)(unsafe.Pointer(&extents[0])), C.uint64_t(len(extents)/2)) != 0 {
				C.cx_reg_disable(b.w.c, r.creg)
				C.cx_reg_free(r.creg)
				r.creg = nil
				C.cx_mem_unmap(b.w.c, r.memh)
				st = C.UCS_ERR_NO_MEMORY
				return
			}
		}
		r.key = packCheckedKey(uint64(r.base), r.n, uint64(r.creg.id), token)
		if r.shared != nil {
			r.key = packSharedKey(uint64(r.base), r.n, uint64(r.creg.id), token, r.shared.id, proc, r.shared.rkey)
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
	if b.closed { // Close ran meanwhile and did not see r
		b.w.call(func() { b.w.unmap(r) })
		return transport.ErrClosed
	}
	b.regs[r] = struct{}{}
	return nil
}

// RemoteKey is the packed key: the registered extent followed by UCX's rkey.
func (r *Registration) RemoteKey() []byte { return bytes.Clone(r.key) }

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
	b := r.b
	b.mu.Lock()
	if r.gone {
		b.mu.Unlock()
		return nil
	}
	r.gone = true
	delete(b.regs, r)
	b.mu.Unlock()
	done := make(chan error, 1)
	if err := b.w.call(func() { b.w.deregister(r, done) }); err != nil {
		return nil // the worker is gone, and with it the mapping
	}
	select {
	case err := <-done:
		if err == nil {
			r.pin.Unpin()
			r.dropView()
		}
		return err
	case <-b.w.done:
		return nil
	}
}

// endpoint is the shared, refcounted state behind Endpoint handles to one
// address. u is loop-owned.
type endpoint struct {
	b      *Backend
	key    string
	addr   []byte // ucx worker address
	refs   int    // under b.mu
	u      *uep
	noCMA  atomic.Bool // process_vm_readv was refused: use UCX
	shared atomic.Bool // a Get used shared keys: linger after the last Close
	maps   mapState    // segments mapped for shared keys (mapGet)
	idle   uint64      // under b.mu: Close count, tells expire it was reused
}

// current returns the live UCP endpoint, creating one if the last was
// closed. Runs on the owner thread.
func (e *endpoint) current() (*uep, error) {
	if e.u != nil && !e.u.closed {
		return e.u, nil
	}
	u, err := e.b.w.connect(e.addr)
	if err != nil {
		return nil, err
	}
	u.maps = &e.maps
	e.u = u
	return u, nil
}

// Endpoint is one caller's reference to a (shared) UCP endpoint.
type Endpoint struct {
	e      *endpoint
	closed atomic.Bool
}

var _ transport.Endpoint = (*Endpoint)(nil)

// Connect returns an endpoint to the backend at addr (another Backend's
// Address). Endpoints to one address share a UCP endpoint and its rkey
// cache; each Endpoint must be closed.
func (b *Backend) Connect(ctx context.Context, addr []byte) (transport.Endpoint, error) {
	ua, err := parseAddr(addr)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, transport.CtxErr(err)
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, transport.ErrClosed
	}
	e := b.eps[string(addr)]
	if e == nil {
		e = &endpoint{b: b, key: string(addr), addr: bytes.Clone(ua)}
		b.eps[e.key] = e
	}
	e.refs++
	b.mu.Unlock()
	h := &Endpoint{e: e}
	if err2 := b.w.call(func() { _, err = e.current() }); err2 != nil {
		err = err2
	}
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("ucx: connect: %w", err)
	}
	return h, nil
}

// EndpointLinger is how long an endpoint that has read shared memory
// (Allocate'd by its peer) stays open after its last Endpoint closed. Its
// cached rkeys keep the peer's segments mapped here, so the next pull from
// the same holder neither unpacks nor page-faults them again; a Connect to
// the same address within the period reuses it. The cost is that a freed
// allocation of the peer stays mapped here (its memory is not returned to
// the system) until the period ends.
const EndpointLinger = 30 * time.Second

// Close releases this reference. The last one force-closes the UCP
// endpoint, or, if it has read shared memory, keeps it for EndpointLinger
// (dropping its other cached rkeys). Idempotent.
func (h *Endpoint) Close() error {
	if !h.closed.CompareAndSwap(false, true) {
		return nil
	}
	e, b := h.e, h.e.b
	b.mu.Lock()
	e.refs--
	last := e.refs == 0
	mine := b.eps[e.key] == e
	linger := last && mine && !b.closed && e.shared.Load()
	if last && mine && !linger {
		delete(b.eps, e.key)
	}
	e.idle++
	gen := e.idle
	b.mu.Unlock()
	switch {
	case linger:
		// Housekeeping only, so not waited for: a pull's Close is on its
		// critical path, and waking the owner thread costs 25–300 µs on
		// the VMs measured here. It rechecks the endpoint when it runs.
		b.w.submit(func() {
			if e.u != nil && !e.u.closed && !b.w.busy(e.u) {
				b.w.dropRkeys(e.u)
				b.w.dropIdleShared(e.u, EndpointLinger)
			}
		})
		time.AfterFunc(EndpointLinger, func() { e.expire(gen) })
	case last:
		b.w.call(func() {
			if e.u != nil {
				b.w.closeEP(e.u, transport.ErrClosed)
			}
		})
	}
	return nil
}

// expire closes a lingering endpoint unless it was reused since Close
// number gen.
func (e *endpoint) expire(gen uint64) {
	b := e.b
	b.mu.Lock()
	if e.refs != 0 || e.idle != gen || b.eps[e.key] != e {
		b.mu.Unlock()
		return
	}
	delete(b.eps, e.key)
	b.mu.Unlock()
	b.w.call(func() {
		if e.u != nil {
			b.w.closeEP(e.u, transport.ErrClosed)
		}
	})
}

// Get performs ops with as few UCX requests as possible: adjacent ops
// (same key, contiguous remote and destination) are coalesced, ranges
// larger than Config.ChunkBytes are split, and all of them are posted with
// one cgo call and kept in flight together.
func (h *Endpoint) Get(ctx context.Context, ops []transport.GetOp) error {
	since := faults()
	err := h.get(ctx, ops)
	if err == nil {
		// shared: this endpoint read shared keys, whose segments are
		// mapped here (mapped copies, or ucp_get_nbx from them).
		err = faultedDuring(since, ops, h.e.shared.Load())
	}
	return err
}

// get is Get before the fault check.
func (h *Endpoint) get(ctx context.Context, ops []transport.GetOp) error {
	if h.closed.Load() {
		return transport.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return transport.CtxErr(err)
	}
	e, w := h.e, h.e.b.w
	keys, opKey, err := planKeys(ops)
	if err != nil || len(keys) == 0 {
		return err
	}
	// A shared key's memory stays readable after its holder died (the
	// segment is mapped here), but the hold died with it: check the holder
	// before and after reading, as for CMA. (A mapped copy checks only
	// after reading: a holder dead before is dead after, and the copy is
	// harmless.)
	holders := sharedHolders(keys)
	if len(holders) > 0 && allShared(keys) && h.e.b.cfg.SharedReads != SharedReadsGet {
		if handled, err := h.mapGet(ctx, ops, opKey, keys, holders); handled {
			return err
		}
	}
	runs := runsOf(ops, opKey)
	if p, ok := cmaTarget(keys); ok && !e.noCMA.Load() {
		var pin runtime.Pinner
		for i := range ops {
			if len(ops[i].Dst) > 0 {
				pin.Pin(&ops[i].Dst[0])
			}
		}
		err := cmaGet(ctx, p, runs)
		pin.Unpin()
		if !errors.Is(err, errCMADenied) {
			return err
		}
		// No ptrace access to the holder: use UCX from now on.
		if e.noCMA.CompareAndSwap(false, true) {
			e.b.cfg.Log().Warn("ucx: one-sided CMA reads not permitted; falling back to ucp_get_nbx", "err", err)
		}
	}
	for _, p := range holders {
		if err := checkAlive(p); err != nil {
			return err
		}
	}
	bt := h.e.b.buildBatch(ops, keys, runs)
	if len(holders) > 0 {
		h.e.shared.Store(true)
	}
	if !w.submit(func() {
		u, err := e.current()
		if err != nil {
			w.finish(bt, err)
			return
		}
		w.post(bt, u)
	}) {
		C.free(unsafe.Pointer(bt.c))
		C.free(unsafe.Pointer(bt.ops))
		bt.pin.Unpin()
		return transport.ErrClosed
	}
	select {
	case err := <-bt.result:
		if err == nil && bt.local {
			for _, p := range holders {
				if err := checkAlive(p); err != nil {
					return err
				}
			}
		}
		return wrapGet(err)
	case <-ctx.Done():
	}
	why := transport.CtxErr(ctx.Err())
	w.submit(func() { w.cancel(bt, why) })
	t := time.NewTimer(cancelGrace)
	defer t.Stop()
	select {
	case err := <-bt.result:
		if err == nil { // completed just before the cancel
			return nil
		}
		return wrapGet(err)
	case <-t.C:
		// UCX still holds the destination buffers; they stay pinned.
		return fmt.Errorf("ucx: get: %w (UCX did not release the buffers within %v)", why, cancelGrace)
	}
}

func wrapGet(err error) error { return err }

type run struct {
	local, remote, n uint64
	key              int
}

type keyInfo struct {
	packed []byte
	rk     remoteKey
}

// sharedHolders lists the distinct holder processes of shared keys that
// live on this host.
func sharedHolders(keys []keyInfo) []procID {
	self, err := selfProc()
	if err != nil {
		return nil
	}
	var out []procID
	for _, k := range keys {
		if k.rk.kind == keyShared && k.rk.proc.host == self.host && !slices.Contains(out, k.rk.proc) {
			out = append(out, k.rk.proc)
		}
	}
	return out
}

// allShared reports whether every key is a shared key.
func allShared(keys []keyInfo) bool {
	for _, k := range keys {
		if k.rk.kind != keyShared {
			return false
		}
	}
	return true
}

// cmaTarget reports whether every key is a one-sided key of one process on
// this host, so that the Get can be served with process_vm_readv.
func cmaTarget(keys []keyInfo) (procID, bool) {
	self, err := selfProc()
	if err != nil || len(keys) == 0 {
		return procID{}, false
	}
	p := keys[0].rk.proc
	for _, k := range keys {
		if k.rk.kind != keyOneSided || k.rk.proc != p {
			return procID{}, false
		}
	}
	return p, p.host == self.host
}

// planKeys parses the distinct keys of ops and validates every op against
// the extent its key carries. opKey[i] is op i's key index, -1 for an empty
// op; no keys means nothing to read.
func planKeys(ops []transport.GetOp) (keys []keyInfo, opKey []int32, err error) {
	// A hold registers one extent per layer, plane and run of blocks, so a
	// scattered KV layout brings thousands of distinct keys: index them by
	// their bytes (m[string(b)] does not allocate) instead of scanning.
	index := map[string]int{}
	opKey = make([]int32, len(ops))
	last := -1
	for i := range ops {
		op := &ops[i]
		if len(op.Dst) == 0 {
			opKey[i] = -1
			continue
		}
		ki := -1
		if last >= 0 && bytes.Equal(keys[last].packed, op.RemoteKey) {
			ki = last
		} else {
			if j, ok := index[string(op.RemoteKey)]; ok {
				ki = j
			}
			if ki < 0 {
				rk, err := parseKey(op.RemoteKey)
				if err != nil {
					return nil, nil, err
				}
				keys = append(keys, keyInfo{packed: op.RemoteKey, rk: rk})
				ki = len(keys) - 1
				index[string(op.RemoteKey)] = ki
			}
		}
		last = ki
		opKey[i] = int32(ki)
		k := &keys[ki].rk
		n := uint64(len(op.Dst))
		if op.RemoteAddr < k.base || op.RemoteAddr-k.base > k.n || n > k.n-(op.RemoteAddr-k.base) {
			return nil, nil, fmt.Errorf("%w: [%#x, +%d) is outside the key's extent [%#x, +%d)",
				transport.ErrNotRegistered, op.RemoteAddr, n, k.base, k.n)
		}
	}
	return keys, opKey, nil
}

// runsOf coalesces adjacent ops (same key, contiguous remote and
// destination) into runs.
func runsOf(ops []transport.GetOp, opKey []int32) []run {
	runs := make([]run, 0, len(ops))
	for i := range ops {
		op := &ops[i]
		ki := int(opKey[i])
		if ki < 0 {
			continue
		}
		n := uint64(len(op.Dst))
		local := uint64(uintptr(unsafe.Pointer(&op.Dst[0])))
		if m := len(runs) - 1; m >= 0 {
			r := &runs[m]
			if r.key == ki && r.remote+r.n == op.RemoteAddr && r.local+r.n == local {
				r.n += n
				continue
			}
		}
		runs = append(runs, run{local: local, remote: op.RemoteAddr, n: n, key: ki})
	}
	return runs
}

// buildBatch splits runs into GETs of at most Config.ChunkBytes and builds
// the C batch.
func (b *Backend) buildBatch(ops []transport.GetOp, keys []keyInfo, runs []run) *batch {
	total := 0
	for _, r := range runs {
		total += chunks(r.n, b.chunk)
	}
	bt := &batch{n: total, result: make(chan error, 1)}
	for _, k := range keys {
		bk := batchKey{rkey: k.rk.rkey, base: k.rk.base} // rkey nil for checked keys
		if k.rk.kind == keyShared {
			bk.shared = k.rk.sharedCacheKey()
		}
		bt.keys = append(bt.keys, bk)
	}
	bt.c = (*C.cx_batch)(C.calloc(1, C.sizeof_cx_batch))
	bt.ops = (*C.cx_get)(C.calloc(C.size_t(total), C.sizeof_cx_get))
	cops := bt.opsSlice()
	j := 0
	for _, r := range runs {
		for off := uint64(0); off < r.n; {
			n := r.n - off
			if b.chunk > 0 && n > b.chunk {
				n = b.chunk
			}
			k := &keys[r.key].rk
			cops[j] = C.cx_get{
				local:  C.uint64_t(r.local + off),
				remote: C.uint64_t(r.remote + off),
				len:    C.uint64_t(n),
				rkey:   C.uint64_t(r.key),
				reg:    C.uint64_t(k.reg),
				token:  C.uint64_t(k.token),
			}
			j++
			off += n
		}
	}
	// UCX writes into the destinations after this goroutine moved on; pin
	// them (a no-op for mmap'd memory) so they stay put and alive.
	for i := range ops {
		if len(ops[i].Dst) > 0 {
			bt.pin.Pin(&ops[i].Dst[0])
		}
	}
	return bt
}

func chunks(n, chunk uint64) int {
	if chunk == 0 {
		return 1
	}
	return int((n + chunk - 1) / chunk)
}

// Close cancels in-flight Gets, closes endpoints, unmaps every registration
// and stops the owner goroutine. Idempotent.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		<-b.w.done
		return nil
	}
	b.closed = true
	regs := b.regs
	b.regs = nil
	for r := range regs {
		r.gone = true
	}
	b.mu.Unlock()
	w := b.w
	w.submit(func() {
		w.stop = func() {
			for r := range regs {
				w.unmap(r)
			}
		}
	})
	<-w.done
	for r := range regs {
		r.pin.Unpin()
	}
	return nil
}
