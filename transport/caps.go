package transport

import (
	"errors"
	"fmt"
)

// Caps describes what a backend can do in its current configuration, so
// callers pick strategies (how to register a hold, where to allocate a
// region, how to detect a stalled read, whether to plan strided reads, how
// large a read may be) by reading it, never by a type assertion on an
// endpoint or by trying and looking at the error. A backend fills it in
// truthfully: a capability it claims works, one it does not claim is not
// relied upon. Each backend's TestCapsMatchBehaviour checks its claims
// against what it does, and CheckCaps (run when connexd opens its data
// plane) refuses a backend whose type lacks an interface its Caps promise.
type Caps struct {
	// ExtentKeys is true when the backend implements ExtentRegistrar and,
	// in its current configuration, RegisterExtents exposes many extents
	// of any memory under one key. When false, register extent by extent
	// with Register (but see AllocationExtentKeys).
	ExtentKeys bool
	// AllocationExtentKeys is true when RegisterExtents gives one key for
	// many extents of memory from this backend's Allocate even where
	// ExtentKeys is false (UCX with onesided reads: registrations on its
	// own allocations are always checked). Use OneKeyForExtents.
	AllocationExtentKeys bool
	// Allocate is true when the backend implements Allocator and its
	// current configuration can allocate memory that peers on the same
	// host read one-sided. An Allocate call can still fail (no room in
	// /dev/shm); callers fall back to memory of their own.
	Allocate bool
	// ManyRegister is true when the backend implements ManyRegisterer:
	// RegisterMany registers many buffers faster than Register one by one
	// (UCX: one hand-off to its worker thread). RegisterEach decides.
	ManyRegister bool
	// ManyDeregister is true when the backend implements ManyDeregisterer
	// (DeregisterAll: one hand-off for many registrations). DeregisterEach
	// decides.
	ManyDeregister bool
	// GuardFaults is true when the backend implements FaultGuard: its
	// copies run outside Go, and it turns a fault on a shrunk file mapping
	// into ErrFault instead of a dead process. connexd guards every region
	// mapping with it then.
	GuardFaults bool
	// Counters is true when the backend implements Counters: counts of
	// its own work that connexd exports as metrics.
	Counters bool
	// Progress is true when Endpoint.GetProgress reports bytes as they
	// land (TCP: each Config.ChunkBytes request, and bytes arriving toward
	// one), so a reader's stall deadline measures progress; when false it
	// reports once, at the end, and a reader bounds each Get by the stall
	// deadline instead.
	Progress bool
	// Strided is true when Endpoint.GetStrided reads a strided op (a head
	// range of a token-major KV block: a piece per token) as one op,
	// without a request per piece where the memory allows (UCX: same-host
	// mapped reads; TCP: an op whose pieces lie back to back at the holder,
	// in requests of many pieces scattered on arrival). When false
	// GetStrided reads the pieces as GetOps and a reader plans GetOps
	// itself.
	Strided bool
	// Views is true when the backend's endpoints implement Viewer and show
	// a holder's memory in place where they can (UCX: a holder on this
	// host whose memory came from Allocate, unless reads of shared keys
	// are configured as GETs). A reader that transforms what it reads
	// (the puller's staged pulls between KV layouts) then views instead
	// of reading into scratch; reach the interface with ViewerOf. When
	// false every byte is read with Get.
	Views bool
	// MaxGetBytes is the largest single GetOp the backend handles well;
	// readers split larger ranges (the puller splits at the smaller of
	// this and its batch size). 0 means no limit: the backend splits and
	// pipelines ranges itself.
	MaxGetBytes int
}

// OneKeyForExtents reports whether RegisterExtents gives one key for many
// extents of some memory; allocated says the memory lies in an allocation
// from this backend's Allocate. When false, register each extent with
// Register.
func (c Caps) OneKeyForExtents(allocated bool) bool {
	return c.ExtentKeys || (allocated && c.AllocationExtentKeys)
}

// ErrCapsLie means a backend's Caps promise an interface its type does not
// implement: a bug in the backend, caught when it is opened (CheckCaps).
var ErrCapsLie = errors.New("transport: backend's Caps promise what it does not implement")

// CheckCaps reports every promise of b's Caps that b's type does not keep
// (an optional interface a flag promises), wrapping ErrCapsLie, and a
// negative MaxGetBytes. Open a backend, then check it, before using it.
func CheckCaps(b Backend) error {
	c := b.Caps()
	var errs []error
	check := func(promised bool, flag string, implemented bool) {
		if promised && !implemented {
			errs = append(errs, fmt.Errorf("%s backend %T: Caps.%s: %w", b.Name(), b, flag, ErrCapsLie))
		}
	}
	_, extents := b.(ExtentRegistrar)
	_, alloc := b.(Allocator)
	_, many := b.(ManyRegisterer)
	_, manyDereg := b.(ManyDeregisterer)
	_, guard := b.(FaultGuard)
	_, counters := b.(Counters)
	check(c.ExtentKeys, "ExtentKeys", extents)
	check(c.AllocationExtentKeys, "AllocationExtentKeys", extents)
	check(c.Allocate, "Allocate", alloc)
	check(c.ManyRegister, "ManyRegister", many)
	check(c.ManyDeregister, "ManyDeregister", manyDereg)
	check(c.GuardFaults, "GuardFaults", guard)
	check(c.Counters, "Counters", counters)
	if c.MaxGetBytes < 0 {
		errs = append(errs, fmt.Errorf("%s backend: Caps.MaxGetBytes %d: %w", b.Name(), c.MaxGetBytes, ErrCapsLie))
	}
	return errors.Join(errs...)
}

// Promised returns b as I, the optional interface that b's Caps flag (named
// for the error) promises; an error wrapping ErrCapsLie when b's type does
// not implement it. Call it only where the flag is set: what a backend can
// do is its Caps, never its type.
func Promised[I any](b Backend, flag string) (I, error) {
	i, ok := b.(I)
	if !ok {
		return i, fmt.Errorf("%s backend %T: Caps.%s: %w", b.Name(), b, flag, ErrCapsLie)
	}
	return i, nil
}

// RegisterEach registers each of mems with b, in one call where b's Caps
// say it registers many at once faster (ManyRegister), else one by one. On
// error none stays registered.
func RegisterEach(b Backend, mems [][]byte) ([]Registration, error) {
	if len(mems) > 1 && b.Caps().ManyRegister {
		mr, err := Promised[ManyRegisterer](b, "ManyRegister")
		if err != nil {
			return nil, err
		}
		return mr.RegisterMany(mems)
	}
	regs := make([]Registration, 0, len(mems))
	for i, mem := range mems {
		reg, err := b.Register(mem)
		if err != nil {
			err = fmt.Errorf("register buffer %d of %d (%d bytes): %w", i, len(mems), len(mem), err)
			return nil, errors.Join(err, DeregisterEach(b, regs))
		}
		regs = append(regs, reg)
	}
	return regs, nil
}

// DeregisterEach deregisters every one of regs (all from b), in one call
// where b's Caps say it deregisters many at once faster (ManyDeregister),
// else one by one, and returns the failures joined.
func DeregisterEach(b Backend, regs []Registration) error {
	if len(regs) > 1 && b.Caps().ManyDeregister {
		md, err := Promised[ManyDeregisterer](b, "ManyDeregister")
		if err == nil {
			return md.DeregisterAll(regs)
		}
		// A lying backend: say so, and still revoke every key.
		return errors.Join(err, DeregisterEach(noMany{b}, regs))
	}
	var errs []error
	for _, r := range regs {
		if err := r.Deregister(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// noMany is a Backend whose Caps deny ManyDeregister.
type noMany struct{ Backend }

func (b noMany) Caps() Caps {
	c := b.Backend.Caps()
	c.ManyDeregister = false
	return c
}
