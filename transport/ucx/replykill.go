//go:build ucx && cgo

package ucx

/*
#cgo pkg-config: ucx
#include "cx.h"
*/
import "C"

import (
	"fmt"

	"github.com/connex/connex/transport"
)

// A deregistration whose replies outlive DeregisterGrace (a reader that
// stopped answering) force-closes the endpoints they are on
// (pollDeregs): the functions here do it without touching an endpoint
// twice or behind the owner's back.

// killReplies force-closes the endpoints creg's replies are on, which
// completes them. UCX may have matched a peer's connection to an endpoint
// this worker reads through (one endpoint serves both directions): that one
// is closed as this worker's own (closeEP: its GETs fail, its rkeys go), not
// behind its back; every reply on a closed endpoint forgets it first, so
// that no later close touches what UCX freed. Loop-owned.
func (w *worker) killReplies(creg *C.cx_reg) {
	var buf [64]C.ucp_ep_h
	for {
		n := int(C.cx_reg_reply_eps(creg, &buf[0], C.size_t(len(buf))))
		if n == 0 {
			return
		}
		for _, ep := range buf[:n] {
			C.cx_reg_forget_ep(creg, ep) // (also when creg is not in w.deregs)
			w.forgetEP(ep)
			if u := w.epOf(ep); u != nil {
				// Ours: closed as ours (a no-op when it is closing already).
				w.closeEP(u, fmt.Errorf("%w: the holder's replies to this peer stalled past %v", transport.ErrPeerGone, DeregisterGrace))
				continue
			}
			C.cx_ep_force_close(ep)
		}
	}
}

// forgetEP drops ep from every reply that names it: the live
// registrations', the refusals' and those of registrations waiting to be
// unmapped. Loop-owned.
func (w *worker) forgetEP(ep C.ucp_ep_h) {
	C.cx_worker_forget_ep(w.c, ep)
	for _, d := range w.deregs {
		if d.r.creg != nil { // nil once unmapped and freed
			C.cx_reg_forget_ep(d.r.creg, ep)
		}
	}
}

// epOf is this worker's endpoint whose UCX endpoint is ep, closing ones
// included (w.closing), or nil.
func (w *worker) epOf(ep C.ucp_ep_h) *uep {
	for c, u := range w.eps {
		if c.ep == ep {
			return u
		}
	}
	for _, c := range w.closing {
		if c.cep.ep == ep {
			return c.u
		}
	}
	return nil
}
