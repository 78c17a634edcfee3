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
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/connex/connex/transport"
)

// Backend is the UCX data plane: one UCP context and worker, owned by one
// goroutine (see the package documentation). It implements
// transport.Backend; all methods are safe for concurrent use.
type Backend struct {
	cfg   Config
	log   *slog.Logger // transport.Options.Log()
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

var (
	_ transport.Backend          = (*Backend)(nil)
	_ transport.ManyDeregisterer = (*Backend)(nil)
	_ transport.ManyRegisterer   = (*Backend)(nil)
)

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
	return OpenConfig(opts, Config{})
}

// OpenConfig starts a UCX backend with the options every backend shares
// (opts: its logger; UCX listens on no socket, so ListenAddr is unused) and
// the UCX-specific configuration cfg.
func OpenConfig(opts transport.Options, cfg Config) (*Backend, error) {
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
	log := opts.Log()
	w, err := startWorker(set, peerErrMode(tls), log.Warn)
	if err != nil {
		return nil, err
	}
	b := &Backend{
		cfg:   cfg,
		log:   log,
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

// Caps: in checked mode the holder checks every read against the
// registration's extents (ExtentKeys) and Deregister cuts them; in
// onesided mode a reader on the same host copies them with
// process_vm_readv, without the holder, so a key can be neither restricted
// to extents nor revoked (safety rests on the lease). Registrations on
// memory from Allocate are checked in either mode (AllocationExtentKeys).
// Allocate works when the transport list has UCX's shared-memory
// transport. Many registrations go to the worker thread in one hand-off
// (ManyRegister, ManyDeregister); copies run in C under the SIGBUS guard
// (GuardFaults); strided ops are read natively (Strided). A Get reports no
// progress before it ends (Progress false). Ranges are split and
// pipelined internally, so callers pass whole pulls to one Get
// (MaxGetBytes 0).
func (b *Backend) Caps() transport.Caps {
	checked := b.cfg.Reads != ReadsOneSided
	return transport.Caps{
		ExtentKeys:           checked,
		AllocationExtentKeys: true,
		Allocate:             allocates(b.tls),
		ManyRegister:         true,
		ManyDeregister:       true,
		GuardFaults:          true,
		Strided:              true,
		Views:                b.cfg.SharedReads != SharedReadsGet,
		MaxGetBytes:          0,
	}
}

// Reads is the read mode of memory this Backend registers (ReadsChecked or
// ReadsOneSided).
func (b *Backend) Reads() string { return b.cfg.Reads }

// TLS is the UCX transport list in effect (Config.TLS, UCX_TLS, or the
// mode's default).
func (b *Backend) TLS() string { return b.tls }

// Address is the packed UCP worker address.
func (b *Backend) Address() []byte { return bytes.Clone(b.addr) }

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
