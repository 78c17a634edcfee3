package transport

// FaultGuard is implemented by backends whose copies run outside Go (UCX's
// C code), where touching a page of a file mapping beyond the file's end
// raises SIGBUS and would kill the process: an engine that truncates its
// own region file, or the shared memory connexd created for it, could
// otherwise take down every hold of its connexd. Caps.GuardFaults says a
// backend implements it.
//
// Once a backend that implements it is open, such a fault on any file
// mapping of the process no longer kills it: the faulting page (for a
// guarded range, the whole range) is replaced by zeroed anonymous memory,
// the copy carries on, and the Get or the holder's reply that touched it
// fails with ErrFault. Copies in Go code get the same treatment.
type FaultGuard interface {
	// Guard watches mem, the mapping of one region: after a fault inside
	// it, every later read of it is refused and Broken reports true.
	Guard(mem []byte) (Guarded, error)
}

// Guarded is one range watched by a FaultGuard.
type Guarded interface {
	// Broken reports whether a copy faulted inside the range: its file
	// shrank, and the mapping now reads as zeros.
	Broken() bool
	// Release stops watching the range; call it before the range is
	// unmapped. Idempotent.
	Release()
}
