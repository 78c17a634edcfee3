//go:build ucx && cgo

package ucx

/*
#cgo pkg-config: ucx
#include <stdlib.h>
#include "cx.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/connex/connex/transport"
)

// Spin budgets of the owner loop before it arms the worker and sleeps. A
// reader with GETs in flight spins longer: its completions arrive without an
// event on some transports (one-sided shared memory).
const (
	idleSpin   = 50 * time.Microsecond
	activeSpin = 2 * time.Millisecond
	// activeSleepMS bounds a sleep while GETs are in flight, in case a
	// completion raises no event.
	activeSleepMS = 1
	progressBurst = 32
	// cancelGrace bounds how long Get waits, after its context ended, for UCX
	// to hand back the destination buffers of a force-closed endpoint. UCX
	// 1.13 cannot cancel a rendezvous receive whose sender died; such a Get
	// returns after the grace with its buffers still pinned (see doc.go).
	cancelGrace = 250 * time.Millisecond
)

func statusErr(op string, st C.ucs_status_t) error {
	if st == C.UCS_OK {
		return nil
	}
	if int(st) == cxErrFault {
		return &StatusError{Op: op, Code: cxErrFault, Status: "the holder's memory faulted: its region file shrank"}
	}
	return &StatusError{Op: op, Code: int(st), Status: C.GoString(C.ucs_status_string(st))}
}

// worker is one UCP context + worker and the goroutine that owns them. All
// fields below "loop-owned" are touched only by that goroutine.
type worker struct {
	cmds     chan func()
	done     chan struct{} // closed when the loop has exited
	sleeping atomic.Bool
	wakefd   int
	errPeer  bool
	log      func(msg string, args ...any)

	// loop-owned
	c       *C.cx_worker
	active  []*batch
	eps     map[*C.cx_ep]*uep
	closing []closingEP
	deregs  []*pendingDereg
	// quarantine holds deregistered Alloc'd memory until shutdown.
	quarantine []*Registration
	epErrors   int64
	// forcedDeregs counts deregistrations whose replies outlived
	// DeregisterGrace, so that their endpoints were force-closed (tests).
	forcedDeregs int
	stop         func() // set by the shutdown command
}

type closingEP struct {
	req unsafe.Pointer
	cep *C.cx_ep
	u   *uep
}

// startWorker starts the owner goroutine and waits until the worker exists.
func startWorker(tls string, errPeer bool, log func(string, ...any)) (*worker, error) {
	w := &worker{
		cmds:    make(chan func(), 256),
		done:    make(chan struct{}),
		errPeer: errPeer,
		log:     log,
		eps:     map[*C.cx_ep]*uep{},
	}
	ready := make(chan error, 1)
	go w.loop(tls, ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return w, nil
}

// submit queues f to run on the owner thread. It returns false if the
// worker has stopped (f will not run).
func (w *worker) submit(f func()) bool {
	select {
	case <-w.done:
		return false
	default:
	}
	select {
	case w.cmds <- f:
	case <-w.done:
		return false
	}
	if w.sleeping.Load() {
		var one = [8]byte{1}
		syscall.Write(w.wakefd, one[:])
	}
	return true
}

// call runs f on the owner thread and waits for it.
func (w *worker) call(f func()) error {
	ran := make(chan struct{})
	if !w.submit(func() { f(); close(ran) }) {
		return transport.ErrClosed
	}
	select {
	case <-ran:
		return nil
	case <-w.done:
		select {
		case <-ran:
			return nil
		default:
			return transport.ErrClosed
		}
	}
}

func (w *worker) loop(tls string, ready chan<- error) {
	// Never unlocked: when the loop returns, the thread exits with it.
	runtime.LockOSThread()
	defer close(w.done)

	ctls := C.CString(tls)
	st := C.cx_open(ctls, &w.c)
	C.free(unsafe.Pointer(ctls))
	if st != C.UCS_OK {
		ready <- fmt.Errorf("%w: %w", transport.ErrUnavailable, statusErr("init", st))
		return
	}
	w.wakefd = int(w.c.wakefd)
	ready <- nil

	last := time.Now()
	for {
		w.runCmds()
		if w.stop != nil {
			w.shutdown()
			return
		}
		n := C.cx_progress(w.c, progressBurst)
		if len(w.active) > 0 {
			w.reap()
		}
		if int64(w.c.ep_errors) != w.epErrors {
			w.epErrors = int64(w.c.ep_errors)
			w.failEndpoints()
		}
		if len(w.closing) > 0 {
			w.pollCloses()
		}
		now := time.Now()
		if len(w.deregs) > 0 {
			w.pollDeregs(now)
		}
		if n > 0 {
			last = now
			continue
		}
		spin, timeout := idleSpin, C.int(-1)
		if len(w.active) > 0 || w.c.replies > 0 || len(w.closing) > 0 || len(w.deregs) > 0 {
			spin, timeout = activeSpin, activeSleepMS
		}
		if now.Sub(last) < spin {
			continue
		}
		w.sleeping.Store(true)
		if len(w.cmds) == 0 {
			C.cx_wait(w.c, timeout)
		}
		w.sleeping.Store(false)
	}
}

func (w *worker) runCmds() {
	for {
		select {
		case f := <-w.cmds:
			f()
		default:
			return
		}
	}
}

// uep is one UCP endpoint with its unpacked rkeys. Loop-owned.
type uep struct {
	c     *C.cx_ep
	rkeys map[string]C.ucp_rkey_h
	// shared caches the rkeys of shared keys by allocation id and rkey
	// bytes; nil means the memory is not mapped here (use the checked
	// path). They outlive single Gets, see Endpoint.Close.
	shared map[string]C.ucp_rkey_h
	// maps is its endpoint's mapped-copy state; copying counts mapped
	// copies (mapGet) reading through the shared rkeys and released is set
	// once the UCP endpoint is gone. Both under maps.mu.
	maps     *mapState
	copying  int
	released bool
	dead     error        // set once the endpoint failed or was closed
	closed   bool         // close started
	up       *atomic.Bool // its endpoint's up flag, cleared when the close starts
}

func (w *worker) connect(addr []byte) (*uep, error) {
	cep := (*C.cx_ep)(C.calloc(1, C.sizeof_cx_ep))
	p := C.CBytes(addr)
	peer := C.int(0)
	if w.errPeer {
		peer = 1
	}
	st := C.cx_ep_create(w.c, p, peer, cep)
	C.free(p)
	if st != C.UCS_OK {
		C.free(unsafe.Pointer(cep))
		return nil, statusErr("ep_create", st)
	}
	u := &uep{c: cep, rkeys: map[string]C.ucp_rkey_h{}, shared: map[string]C.ucp_rkey_h{}}
	w.eps[cep] = u
	return u, nil
}

// rkey returns the unpacked rkey for packed on u, unpacking it once.
func (w *worker) rkey(u *uep, packed []byte) (C.ucp_rkey_h, error) {
	if rk, ok := u.rkeys[string(packed)]; ok {
		return rk, nil
	}
	var rk C.ucp_rkey_h
	p := C.CBytes(packed)
	st := C.cx_rkey_unpack(u.c, p, &rk)
	C.free(p)
	if st != C.UCS_OK {
		return nil, fmt.Errorf("%w: %w", transport.ErrBadKey, statusErr("rkey_unpack", st))
	}
	u.rkeys[string(packed)] = rk
	return rk, nil
}

// closeEP force-closes u: every GET in flight on it completes with
// UCS_ERR_CANCELED. why is what later users of u see.
func (w *worker) closeEP(u *uep, why error) {
	if u.closed {
		return
	}
	u.closed = true
	if u.up != nil {
		u.up.Store(false)
	}
	if u.dead == nil {
		u.dead = why
	}
	// Replies on this endpoint (a peer's requests UCX matched to it) must
	// not close it again later.
	w.forgetEP(u.c.ep)
	var st C.ucs_status_t
	req := C.cx_ep_close(w.c, u.c, 1, &st)
	delete(w.eps, u.c)
	// GETs waiting for a reply have no UCX request the close could cancel;
	// complete them here. Rendezvous receives are canceled by UCX.
	for _, b := range w.active {
		if b.u == u && b.c != nil {
			C.cx_batch_abort(w.c, b.ops, C.int(b.n), C.UCS_ERR_CANCELED)
		}
	}
	if req != nil {
		w.closing = append(w.closing, closingEP{req: req, cep: u.c, u: u})
		return
	}
	w.releaseEP(u, u.c)
}

func (w *worker) releaseEP(u *uep, cep *C.cx_ep) {
	w.dropRkeys(u)
	drop := true
	if ms := u.maps; ms != nil {
		ms.mu.Lock()
		if ms.u == u {
			ms.u, ms.segs, ms.unmapped = nil, nil, nil
		}
		u.released = true
		// Mapped copies may still read through the shared rkeys'
		// mappings; then the last one has them destroyed (mapGet).
		drop = u.copying == 0
		ms.mu.Unlock()
	}
	if drop {
		w.dropShared(u)
	}
	C.free(unsafe.Pointer(cep))
}

// dropIdleShared destroys u's shared rkeys that mapped copies have not
// used for idle (and forgets the allocations it could not map), so that a
// busy endpoint does not keep freed holder allocations mapped forever.
// Loop-owned.
func (w *worker) dropIdleShared(u *uep, idle time.Duration) {
	for ck, rk := range u.shared {
		if rk == nil {
			delete(u.shared, ck) // retry the unpack next time
		}
	}
	if u.maps == nil {
		return
	}
	for _, ck := range u.maps.evictIdle(u, idle) {
		if rk := u.shared[ck]; rk != nil {
			C.cx_rkey_destroy(rk)
		}
		delete(u.shared, ck)
	}
}

// dropShared destroys u's shared rkeys, unmapping the peer segments UCX
// attached for them. Loop-owned.
func (w *worker) dropShared(u *uep) {
	for k, rk := range u.shared {
		if rk != nil {
			C.cx_rkey_destroy(rk)
		}
		delete(u.shared, k)
	}
}

// dropRkeys destroys u's cached rkeys of non-shared keys (one per
// registration, so they would pile up on an endpoint kept for reuse).
// Loop-owned; no batch on u may be in flight.
func (w *worker) dropRkeys(u *uep) {
	for k, rk := range u.rkeys {
		C.cx_rkey_destroy(rk)
		delete(u.rkeys, k)
	}
}

// busy reports whether a batch on u is in flight. Loop-owned.
func (w *worker) busy(u *uep) bool {
	for _, b := range w.active {
		if b.u == u {
			return true
		}
	}
	return false
}

func (w *worker) pollCloses() {
	keep := w.closing[:0]
	for _, c := range w.closing {
		if C.cx_req_poll(c.req) == C.UCS_INPROGRESS {
			keep = append(keep, c)
			continue
		}
		w.releaseEP(c.u, c.cep)
	}
	w.closing = keep
}

// failEndpoints closes endpoints whose error callback fired (peer error
// handling mode only).
func (w *worker) failEndpoints() {
	for cep, u := range w.eps {
		if cep.status != C.UCS_OK {
			w.closeEP(u, statusErr("endpoint", C.ucs_status_t(cep.status)))
		}
	}
}

// batch is one Get's GETs. The C parts live in C memory so UCX may keep
// pointers to them; the destination buffers are pinned until UCX is done.
type batch struct {
	c      *C.cx_batch
	ops    *C.cx_get
	n      int
	keys   []batchKey // distinct keys; ops[i].rkey holds an index until post
	local  bool       // some GETs read a shared key's memory one-sided
	u      *uep
	pin    runtime.Pinner
	why    error // set when the batch was canceled on purpose
	result chan error
	posted bool
}

// batchKey is what post needs of one distinct key of a batch.
type batchKey struct {
	rkey   []byte // UCX's packed rkey; nil for checked keys
	shared string // shared keys: the rkey cache key (allocation id + rkey)
	base   uint64 // an address inside the key's memory
}

func (b *batch) opsSlice() []C.cx_get { return unsafe.Slice(b.ops, b.n) }

// post resolves rkeys and posts every GET of b on u with one cgo call.
// A shared key's GETs are raw (one-sided) when its memory is mapped here,
// else they keep the key's checked registration.
func (w *worker) post(b *batch, u *uep) {
	b.u = u
	rks := make([]C.ucp_rkey_h, len(b.keys))
	local := make([]bool, len(b.keys))
	for i, k := range b.keys {
		switch {
		case k.rkey == nil:
			continue // checked key: no UCX rkey
		case k.shared != "":
			rks[i], _, local[i] = w.sharedRkey(u, k.shared, k.rkey, k.base)
			b.local = b.local || local[i]
			continue
		}
		rk, err := w.rkey(u, k.rkey)
		if err != nil {
			w.finish(b, err)
			return
		}
		rks[i] = rk
	}
	ops := b.opsSlice()
	for i := range ops {
		k := ops[i].rkey
		if local[k] {
			ops[i].reg = 0
		}
		if ops[i].reg == 0 {
			ops[i].rkey = C.uint64_t(uintptr(unsafe.Pointer(rks[k])))
		}
	}
	C.cx_post(u.c, b.ops, C.int(b.n), b.c)
	b.posted = true
	if b.c.pending == 0 {
		w.finish(b, nil)
		return
	}
	w.active = append(w.active, b)
}

func (w *worker) reap() {
	keep := w.active[:0]
	for _, b := range w.active {
		if b.c.pending > 0 {
			keep = append(keep, b)
			continue
		}
		w.finish(b, nil)
	}
	clear(w.active[len(keep):])
	w.active = keep
}

// cancel force-closes the endpoint b runs on, so that b (and every other
// batch on that endpoint) completes now.
func (w *worker) cancel(b *batch, why error) {
	if b.c == nil || b.u == nil {
		return // finished already
	}
	b.why = why
	w.closeEP(b.u, fmt.Errorf("%w: endpoint force-closed after another Get ended: %w", transport.ErrPeerGone, why))
	w.reap()
}

// finish reports b's outcome and releases its C memory. err overrides the
// status UCX reported.
func (w *worker) finish(b *batch, err error) {
	if err == nil && b.why != nil {
		err = b.why
	}
	if err == nil && b.c.status != C.UCS_OK {
		st := C.ucs_status_t(b.c.status)
		err = statusErr("GET", st)
		if st == C.UCS_ERR_CANCELED && b.u != nil && b.u.dead != nil {
			err = b.u.dead
		}
	}
	C.free(unsafe.Pointer(b.c))
	C.free(unsafe.Pointer(b.ops))
	b.c, b.ops = nil, nil
	b.pin.Unpin()
	b.result <- err
}

// shutdown cancels everything in flight, closes endpoints and destroys the
// worker. Registrations are unmapped by the stop function first.
func (w *worker) shutdown() {
	for _, u := range w.eps {
		w.closeEP(u, transport.ErrClosed)
	}
	deadline := time.Now().Add(cancelGrace)
	for (len(w.active) > 0 || len(w.closing) > 0) && time.Now().Before(deadline) {
		C.cx_progress(w.c, progressBurst)
		w.reap()
		w.pollCloses()
	}
	w.stop()
	for _, r := range w.quarantine {
		w.unmap(r)
	}
	if len(w.active) > 0 || len(w.closing) > 0 {
		// UCX kept requests past the grace period; destroying the worker
		// would free memory they reference, so leak it instead.
		w.log("ucx: worker shut down with requests still in flight; leaking it",
			"gets", len(w.active), "closing", len(w.closing))
		for _, b := range w.active {
			b.result <- transport.ErrClosed
		}
		leaked.mu.Lock()
		leaked.batches = append(leaked.batches, w.active...)
		leaked.mu.Unlock()
		return
	}
	if destroyAborts() {
		// UCX 1.13 and older abort the process destroying a worker one of
		// whose peers died mid wire-up (destroyAborts), which no caller can rule
		// out: the worker is left to the process's exit. Its memory
		// registrations are gone already (stop, quarantine above).
		C.cx_abandon(w.c)
		abandonedWorkers.Add(1)
		w.c = nil
		return
	}
	C.cx_close(w.c)
	w.c = nil
}

// destroyAborts reports whether this process's libucp (1.13 and older)
// aborts the process in ucp_worker_destroy when a peer died in the middle
// of a wire-up: it asserts on the wire-up reply left queued for that peer
// as it purges it (the assertion went in openucx/ucx#8175).
func destroyAborts() bool {
	major, minor, _ := libVersion()
	return major < 1 || (major == 1 && minor <= 13)
}

// libVersion is the libucp this process runs with: major, minor, release.
func libVersion() (major, minor, release int) {
	var a, b, c C.uint
	C.ucp_get_version(&a, &b, &c)
	return int(a), int(b), int(c)
}

// abandonedWorkers counts the workers Close left undestroyed because of
// the UCX version (AbandonedWorkers; not those leaked with requests still
// in flight, above).
var abandonedWorkers atomic.Int64

// AbandonedWorkers is how many closed Backends' UCX workers this process
// left undestroyed because of the UCX version: on UCX 1.13 and older, whose
// ucp_worker_destroy aborts the process when a peer died during a wire-up,
// a closed Backend keeps its worker (descriptors, sockets and memory) until
// the process exits. Zero on later UCX.
func AbandonedWorkers() int64 { return abandonedWorkers.Load() }

// DeregisterGrace is how long Deregister waits for replies already being
// sent from the memory before it force-closes the endpoints they are on.
const DeregisterGrace = time.Second

type pendingDereg struct {
	r        *Registration
	deadline time.Time
	killed   bool
	done     chan<- error
}

// deregister revokes r; done receives the outcome once no reply reads r.
func (w *worker) deregister(r *Registration, done chan<- error) {
	if r.alloc {
		// An RMA key cannot be revoked: a peer holding it may still GET,
		// and on emulated transports the holder's CPU would read the
		// address. Keep the memory mapped until the Backend closes.
		w.quarantine = append(w.quarantine, r)
		done <- nil
		return
	}
	if r.rma {
		// Onesided Register: the memory is the caller's. ucp_mem_unmap
		// drops UCX's mapping, but UCX 1.13 cannot revoke an rkey a peer
		// already unpacked: over CMA a late GET still reads the bytes while
		// the caller keeps them mapped (see doc.go, "One-sided reads").
		done <- w.unmap(r)
		return
	}
	if r.creg != nil && C.cx_reg_disable(w.c, r.creg) > 0 {
		w.deregs = append(w.deregs, &pendingDereg{r: r, deadline: time.Now().Add(DeregisterGrace), done: done})
		return
	}
	done <- w.unmap(r)
}

func (w *worker) pollDeregs(now time.Time) {
	// Not w.deregs[:0]: killReplies walks w.deregs while this loop runs.
	keep := make([]*pendingDereg, 0, len(w.deregs))
	for _, d := range w.deregs {
		switch {
		case d.r.creg.inflight == 0:
			d.done <- w.unmap(d.r)
		case now.After(d.deadline) && !d.killed:
			w.log("ucx: deregister: replies still in flight; force-closing their endpoints",
				"replies", int64(d.r.creg.inflight))
			w.killReplies(d.r.creg)
			d.killed = true
			w.forcedDeregs++
			d.deadline = now.Add(DeregisterGrace)
			keep = append(keep, d)
		case now.After(d.deadline):
			// UCX still owns sends from this memory: keep it mapped (and
			// pinned) forever rather than let a peer read reused memory.
			leaked.mu.Lock()
			leaked.regs = append(leaked.regs, d.r)
			leaked.mu.Unlock()
			d.done <- fmt.Errorf("ucx: deregister: %d replies never completed; memory left registered",
				int64(d.r.creg.inflight))
		default:
			keep = append(keep, d)
		}
	}
	w.deregs = keep
}

// unmap releases r's table entry and UCX mapping. Loop-owned.
func (w *worker) unmap(r *Registration) error {
	if r.creg != nil {
		C.cx_reg_disable(w.c, r.creg)
	}
	st := C.cx_mem_unmap(w.c, r.memh)
	if r.creg != nil && r.creg.inflight == 0 {
		C.cx_reg_free(r.creg)
		r.creg = nil
	}
	return statusErr("mem_unmap", st)
}

// leaked keeps what UCX never released reachable: batches a shutdown gave
// up on and registrations whose replies never completed (their pinned
// memory must stay valid, and a runtime.Pinner collected while pinned
// panics the process). Every worker's loop appends to it.
var leaked struct {
	mu      sync.Mutex
	batches []*batch
	regs    []*Registration
}
