package transport

// Caps describes what a backend can do in its current configuration, so
// callers pick strategies (how to register a hold, where to allocate a
// region, how many GETs to keep in flight) by reading it instead of by type
// assertions or by trying and looking at the error. A backend fills it in
// truthfully: a capability it claims works (tests check each backend's
// claims against what it does), one it does not claim is not relied upon.
type Caps struct {
	// OneSided is true when a GET completes without the holder's CPU copying
	// the bytes (RDMA, CMA, UCX-allocated shared memory).
	OneSided bool
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
	// Revocable is true when Deregister cuts reads of a registration of
	// the caller's memory (Register, RegisterExtents on memory not from
	// Allocate): no GET on its key succeeds once Deregister returns, and
	// reads already running end. When false, a reader that kept the key
	// can read the memory until it is unmapped, and safety rests on the
	// lease (a reader's deadline below the hold's retention). Memory from
	// Allocate is never revocable for readers on its host, which copy
	// from their own mapping of it.
	Revocable bool
	// Progress is true when the backend's endpoints implement
	// ProgressEndpoint: a Get reports bytes as they land (TCP: each
	// Config.ChunkBytes request, and bytes arriving toward one), so a
	// reader's stall deadline can measure progress instead of how long a
	// whole batch takes.
	Progress bool
	// Strided is true when the backend's endpoints implement
	// StridedEndpoint: a strided op (a head range of a token-major KV
	// block: a piece per token) is one op, read without a request per
	// piece where the memory allows (UCX: same-host mapped reads; other
	// paths read its pieces one by one).
	Strided bool
	// MaxInFlight is the number of GETs a reader should keep outstanding
	// per endpoint for full bandwidth; 0 means "no preference".
	MaxInFlight int
	// MaxGetBytes is the largest single GET the backend handles well;
	// callers split larger ranges. 0 means no limit.
	MaxGetBytes int
}

// OneKeyForExtents reports whether RegisterExtents gives one key for many
// extents of some memory; allocated says the memory lies in an allocation
// from this backend's Allocate. When false, register each extent with
// Register.
func (c Caps) OneKeyForExtents(allocated bool) bool {
	return c.ExtentKeys || (allocated && c.AllocationExtentKeys)
}
