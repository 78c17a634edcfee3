package transport

import "context"

// ProgressEndpoint is an Endpoint that reports, during a Get, how many bytes
// of it have landed, so that a caller can tell a slow transfer (bytes keep
// landing, however slowly) from a stalled one (nothing lands) without
// bounding each Get by a fixed time. Caps.Progress says a backend's
// endpoints implement it.
type ProgressEndpoint interface {
	Endpoint
	// GetProgress is Get; it calls progress with the bytes of ops that
	// landed since its previous call (one backend-sized piece at a time,
	// in any order), or with 0 when bytes are arriving toward ops but no
	// piece has completed yet (a slow link), on Get's goroutine, never
	// after it returned. The calls of a failed Get need not sum to
	// anything.
	GetProgress(ctx context.Context, ops []GetOp, progress func(n int)) error
}
