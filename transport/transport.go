// Package transport is Connex's data plane: it exposes registered memory to
// remote readers and performs batched one-sided GETs from them.
//
// The shape follows NIXL's backend engines: a Backend registers memory and
// hands out packed remote keys; a reader connects an Endpoint to the holder's
// address and posts batches of GetOps against those keys. Backends differ in
// how bytes move (UCX RMA, plain TCP) but all of them obey the same rules:
//
//   - Only memory that was Registered, and only while it stays registered, can
//     be read by a peer. A GET outside a registration fails with
//     ErrNotRegistered; it never returns other bytes.
//   - Get never blocks past its context: on deadline or cancel the in-flight
//     operations are abandoned (the endpoint is closed if the backend cannot
//     cancel them one by one) and the call returns an error wrapping
//     ErrCanceled or ErrTimeout.
//   - A dead or unreachable peer surfaces as ErrPeerGone.
//
// Backend-specific status codes (UCX's ucs_status_t, socket errors) are turned
// into the sentinel errors below at the backend boundary and never leak past it.
package transport

import (
	"context"
	"errors"
	"fmt"
	"sort"
)

// Sentinel errors a caller can branch on with errors.Is. Backends wrap them
// with context (peer address, key, offset).
var (
	// ErrPeerGone means the remote side died, closed, or cannot be reached.
	ErrPeerGone = errors.New("transport: peer gone")
	// ErrCanceled means the caller's context was canceled before completion.
	ErrCanceled = errors.New("transport: canceled")
	// ErrTimeout means the caller's deadline passed before completion.
	ErrTimeout = errors.New("transport: timed out")
	// ErrNotRegistered means a GET named a key or a byte range that the
	// holder does not (or no longer) expose.
	ErrNotRegistered = errors.New("transport: range not registered")
	// ErrBadKey means a packed remote key could not be decoded.
	ErrBadKey = errors.New("transport: malformed remote key")
	// ErrClosed means the Backend or Endpoint was already closed.
	ErrClosed = errors.New("transport: closed")
	// ErrUnavailable means the backend cannot run on this machine (for
	// example the binary was built without UCX or libucp failed to load).
	ErrUnavailable = errors.New("transport: backend unavailable")
	// ErrFault means memory a Get read from or wrote into faulted: the file
	// behind a mapping shrank (an engine truncated its region) while it was
	// in use. The bytes are lost; the region must be dropped and created
	// again. The process survives it (see FaultGuard).
	ErrFault = errors.New("transport: memory fault (a region's file shrank under the copy)")
)

// Backend is one data-plane implementation. All methods are safe for
// concurrent use.
type Backend interface {
	// Name is the configured backend name ("tcp", "ucx").
	Name() string
	// Caps reports what the backend can do in its current configuration;
	// callers choose registration and read strategies from it.
	Caps() Caps
	// Address is what a reader passes to Connect to reach this backend (a
	// host:port for TCP, a packed worker address for UCX). Opaque bytes.
	Address() []byte
	// Register exposes mem to remote readers until Deregister is called on
	// the returned Registration. mem must stay mapped until then.
	Register(mem []byte) (Registration, error)
	// Connect returns an endpoint to the holder at addr. Endpoints may be
	// cached and shared by the backend; Close on an Endpoint releases the
	// caller's reference.
	Connect(ctx context.Context, addr []byte) (Endpoint, error)
	// Close deregisters everything, closes endpoints and stops background
	// goroutines. It is idempotent.
	Close() error
}

// Registration is memory exposed for remote reads.
type Registration interface {
	// RemoteKey is the packed key a reader needs to GET from this memory.
	// It is only meaningful to the same kind of backend.
	RemoteKey() []byte
	// RemoteAddr is the address a reader names for the first registered byte
	// (the virtual address for UCX, 0 for TCP). Byte i of the registered
	// memory is at RemoteAddr()+i.
	RemoteAddr() uint64
	// Len is the number of registered bytes.
	Len() int
	// Deregister revokes remote access. After it returns no new GET on this
	// key succeeds. It is idempotent.
	Deregister() error
}

// GetOp reads len(Dst) bytes from the peer's registered memory named by
// RemoteKey, starting at RemoteAddr, into Dst.
type GetOp struct {
	RemoteKey  []byte
	RemoteAddr uint64
	Dst        []byte
}

// Endpoint is a reader's connection to one holder. Every backend's
// endpoints have every method; how they work is the backend's Caps
// (Progress, Strided), which a reader reads to choose a strategy.
type Endpoint interface {
	// Get performs every op in ops and returns when all completed, one
	// failed, or ctx ended. Backends keep many ops in flight and may
	// coalesce or split them. On error the contents of every Dst are
	// undefined.
	Get(ctx context.Context, ops []GetOp) error
	// GetProgress is Get; it calls progress with the bytes of ops that
	// landed since its previous call, on Get's goroutine, never after it
	// returned. With Caps.Progress the calls come as bytes land (one
	// backend-sized piece at a time, in any order, or 0 when bytes are
	// arriving toward ops but no piece has completed yet: a slow link), so
	// a caller can tell a slow transfer from a stalled one without
	// bounding each Get by a fixed time. Without it there is one call, with
	// every byte of ops, once they all landed: measure such a Get by its
	// duration instead. The calls of a failed Get need not sum to
	// anything.
	GetProgress(ctx context.Context, ops []GetOp, progress func(n int)) error
	// GetStrided is Get for strided ops: it returns when every piece has
	// landed, one failed, or ctx ended, with the errors Get returns. With
	// Caps.Strided an op is read without a request or a copy call per
	// piece where the memory allows; without it the endpoint reads the
	// pieces as GetOps (StridedOp.AppendPieces), and a reader does better
	// to plan GetOps itself.
	GetStrided(ctx context.Context, ops []StridedOp) error
	// GetStridedProgress is GetStrided; it calls progress as GetProgress
	// does (with Caps.Progress as bytes land, else once at the end:
	// StridedProgressAtEnd).
	GetStridedProgress(ctx context.Context, ops []StridedOp, progress func(n int)) error
	// Close releases the endpoint. In-flight Gets on it fail with ErrClosed
	// or ErrCanceled.
	Close() error
}

// CtxErr maps a context error to the transport sentinels, so callers can
// branch on ErrTimeout / ErrCanceled regardless of backend.
func CtxErr(err error) error {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return errors.Join(ErrTimeout, err)
	case errors.Is(err, context.Canceled):
		return errors.Join(ErrCanceled, err)
	default:
		return err
	}
}

// Extent is the byte range [Off, Off+Len) of a registered buffer.
type Extent struct {
	Off uint64
	Len uint64
}

// ExtentRegistrar is implemented by backends that can expose only some
// extents of one buffer under a single key. A hold of scattered KV blocks
// has thousands of extents (layer × plane × run of blocks); one key for all
// of them keeps its descriptors small. Reads must lie within one extent,
// else they fail with ErrNotRegistered; byte Off of the buffer is at
// RemoteAddr()+Off. Whether it works in the backend's current
// configuration, and on which memory, is Caps.OneKeyForExtents: decide
// from that, not from the type or an error.
type ExtentRegistrar interface {
	// RegisterExtents exposes the extents of mem (sorted by Off, not
	// overlapping, inside mem) until Deregister.
	RegisterExtents(mem []byte, extents []Extent) (Registration, error)
}

// ValidateExtents checks that extents are non-empty, inside a buffer of n
// bytes, sorted by Off and disjoint, as ExtentRegistrar requires.
func ValidateExtents(extents []Extent, n uint64) error {
	var prevEnd uint64
	for i, e := range extents {
		if e.Len == 0 || e.Off > n || e.Len > n-e.Off || (i > 0 && e.Off < prevEnd) {
			return fmt.Errorf("extent %d [%d,+%d) is empty, outside %d bytes, or out of order", i, e.Off, e.Len, n)
		}
		prevEnd = e.Off + e.Len
	}
	return nil
}

// JoinAdjacent returns sorted, disjoint extents (ValidateExtents) with every
// run of adjacent extents joined into one. Backends that check reads
// against a registration's extents join them first: readers may join reads
// that run on from one extent into the next (a hold's K and V planes of one
// block are adjacent when a layer holds one block), and such a read is
// inside the registration's union.
func JoinAdjacent(extents []Extent) []Extent {
	out := make([]Extent, 0, len(extents))
	for _, e := range extents {
		if n := len(out); n > 0 && out[n-1].Off+out[n-1].Len == e.Off {
			out[n-1].Len += e.Len
			continue
		}
		out = append(out, e)
	}
	return out
}

// PeriodicExtents are sorted, disjoint extents kept as one period: Runs
// repeated Periods times, each Stride bytes further on. A hold's extents —
// the same runs of blocks in every layer and K/V plane, a plane apart — are
// one period, so a backend that checks reads against a registration's
// extents keeps a few runs instead of one extent per layer and plane
// (64 × 16 bytes for a 32-layer hold of one run: make bench-holds).
type PeriodicExtents struct {
	Runs            []Extent
	Stride, Periods uint64 // Periods 1 (Stride 0): Runs are all the extents
}

// NewPeriodicExtents finds the shortest period of extents (sorted and
// disjoint, ValidateExtents): the fewest first runs, their count dividing
// len(extents), such that extent i is run i mod len(Runs) moved on
// (i / len(Runs)) × Stride; else the extents themselves, once. Runs is a
// copy.
func NewPeriodicExtents(extents []Extent) PeriodicExtents {
	n := len(extents)
	for r := 1; r <= n/2; r++ {
		if n%r != 0 {
			continue
		}
		stride := extents[r].Off - extents[0].Off
		same := stride > 0
		for i := r; same && i < n; i++ {
			same = extents[i].Off == extents[i-r].Off+stride && extents[i].Len == extents[i-r].Len
		}
		if same {
			return PeriodicExtents{Runs: append([]Extent(nil), extents[:r]...), Stride: stride, Periods: uint64(n / r)}
		}
	}
	return PeriodicExtents{Runs: append([]Extent(nil), extents...), Periods: 1}
}

// Allows reports whether [off, off+n) lies inside one extent. A range
// that crosses from one period into the next runs past its run's end in
// the first period, and is refused like any other.
func (p PeriodicExtents) Allows(off, n uint64) bool {
	if len(p.Runs) == 0 || off < p.Runs[0].Off {
		return false
	}
	if p.Periods > 1 {
		k := (off - p.Runs[0].Off) / p.Stride
		if k >= p.Periods {
			return false
		}
		off -= k * p.Stride
	}
	// The last run starting at or before off.
	i := sort.Search(len(p.Runs), func(i int) bool { return p.Runs[i].Off > off }) - 1
	if i < 0 {
		return false
	}
	e := p.Runs[i]
	return off-e.Off <= e.Len && n <= e.Len-(off-e.Off)
}

// Allocator is implemented by backends that can allocate memory which peers
// on the same host read one-sided, at memory-copy speed and without the
// holder's CPU (UCX on shared memory: the reader maps the allocation and
// copies from it). connexd uses it for regions it creates for an engine
// (region.create): the engine maps Allocation.Path, and holds on that
// memory get keys that carry the one-sided path besides the backend's usual
// one. Caps.Allocate says whether the backend's current configuration
// allocates such memory; decide from that, not from the type.
type Allocator interface {
	// Allocate returns at least n bytes of shareable memory, zeroed.
	Allocate(n int) (Allocation, error)
}

// Allocation is memory from an Allocator.
type Allocation interface {
	// Bytes is the memory, valid until Free.
	Bytes() []byte
	// Path is a file that other processes of this host (same user) open
	// and mmap to share the memory, e.g. /proc/<pid>/fd/<n>; connexd opens
	// it itself to hand engines of other uids the descriptor
	// (kvmem/handover). It stays
	// valid until Free or until this process exits; a process that mapped
	// it keeps its mapping after either.
	Path() string
	// Free releases the memory. Every Registration made on it must have
	// been deregistered. Idempotent.
	Free() error
}

// ManyDeregisterer is implemented by backends that deregister many
// registrations at once faster than one by one (UCX: one hand-off to its
// worker thread instead of one per registration), when Caps.ManyDeregister
// says so; use DeregisterEach. DeregisterAll does what
// Deregister does for each of regs, all from this backend, and returns the
// failures joined.
type ManyDeregisterer interface {
	DeregisterAll(regs []Registration) error
}

// ManyRegisterer is implemented by backends that register many buffers at
// once faster than one by one (UCX: one hand-off to its worker thread),
// when Caps.ManyRegister says so; use RegisterEach. RegisterMany does what Register does for each of mems; on error none
// stays registered.
type ManyRegisterer interface {
	RegisterMany(mems [][]byte) ([]Registration, error)
}

// ProgressAtEnd is GetProgress for a backend without Caps.Progress: get
// (its Get), then one call of progress with every byte of ops once they
// all landed.
func ProgressAtEnd(ctx context.Context, ops []GetOp, progress func(n int), get func(context.Context, []GetOp) error) error {
	err := get(ctx, ops)
	if err == nil && progress != nil {
		n := 0
		for _, op := range ops {
			n += len(op.Dst)
		}
		progress(n)
	}
	return err
}
