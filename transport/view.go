package transport

import (
	"context"
	"fmt"
)

// ViewRange names Len bytes of a holder's registered memory: under
// RemoteKey, from RemoteAddr, as a GetOp names the bytes it reads.
type ViewRange struct {
	RemoteKey  []byte
	RemoteAddr uint64
	Len        uint64
}

// Viewer is implemented by endpoints that can show a holder's registered
// memory to this process in place: UCX's, for holders on this host whose
// memory is a shared allocation (its memory is mapped here), unless its
// Config.SharedReads is "get". A reader that reads bytes only to transform
// them (a pull between KV layouts that regroups every element) transforms
// them straight from the holder's memory instead, in one pass, without a
// Get into scratch memory first. A backend's Caps.Views says its endpoints
// implement it (reach it with ViewerOf); without that, or where a View
// says it did not handle the ranges, read them with Get.
type Viewer interface {
	// View calls fn once with views[i] holding the bytes of ranges[i]
	// (nil for an empty range), read in place from the holder's memory,
	// and returns what fn returns. Every range must lie in its key's
	// registered memory, as a GetOp's must (ErrNotRegistered otherwise,
	// fn not called).
	//
	// handled is false, with fn not called and no error, when the
	// endpoint cannot show every range here (a holder on another host,
	// memory that is not a shared allocation, reads configured as GETs):
	// Get the ranges instead. A View of the same holder may be handled
	// for some ranges and not for others (a holder's ranks on two hosts).
	//
	// The views alias the holder's memory: they are valid only while fn
	// runs, so fn must neither keep them nor return before goroutines it
	// started stopped touching them, and it must not write them. The
	// holder itself does not write memory it holds for a pull.
	//
	// After fn returns View checks the holders, as Get does: one that
	// died meanwhile fails the View with ErrPeerGone (its memory stays
	// readable here, but its hold died with it and the bytes are not to
	// be trusted), and a fault in a view (a holder's file shrank, see
	// FaultGuard: the view then read zeros) or in memory fn wrote fails it
	// with ErrFault. View returns at once with ctx's error (CtxErr) when
	// ctx has ended; while fn runs, ctx is fn's to watch: a long fn
	// checks it between pieces of its work and returns CtxErr(ctx.Err()).
	View(ctx context.Context, ranges []ViewRange, fn func(views [][]byte) error) (handled bool, err error)
}

// ViewerOf returns ep, an endpoint of b, as the Viewer that b's Caps.Views
// promises; an error wrapping ErrCapsLie when ep's type does not implement
// it. Call it only where Caps.Views is set: what a backend can do is its
// Caps, never its endpoints' type.
func ViewerOf(b Backend, ep Endpoint) (Viewer, error) {
	v, ok := ep.(Viewer)
	if !ok {
		return nil, fmt.Errorf("%s backend %T: Caps.Views, but its endpoint %T is no Viewer: %w", b.Name(), b, ep, ErrCapsLie)
	}
	return v, nil
}
