//go:build ucx && cgo

package ucx

/*
#include "cx.h"
*/
import "C"

import "unsafe"

// Test support: what reaches the reader's reply handler (cx_on_get_rep)
// from anyone who can send it an active message. Nothing in the Backend's
// API calls these.

// armedSlots is the ids of the checked GETs waiting for their reply. It
// must run on the worker's goroutine (worker.submit).
func (w *worker) armedSlots() []uint64 {
	if w.c.slots == nil {
		return nil
	}
	var ids []uint64
	for i, s := range unsafe.Slice(w.c.slots, w.c.capslots) {
		if s.state == 1 {
			ids = append(ids, uint64(i)<<32|uint64(s.gen))
		}
	}
	return ids
}

// deliverReply hands the reply handler a reply to slot, as if it had come
// over UCX (eager, data inline), and returns the replies the worker has
// refused so far. It must run on the worker's goroutine.
func (w *worker) deliverReply(slot, nonce uint64, status int64, data []byte) int64 {
	h := C.cx_rep_hdr{slot: C.uint64_t(slot), nonce: C.uint64_t(nonce), status: C.int64_t(status)}
	var p C.ucp_am_recv_param_t
	var d unsafe.Pointer
	if len(data) > 0 {
		d = unsafe.Pointer(&data[0])
	}
	C.cx_on_get_rep(unsafe.Pointer(w.c), unsafe.Pointer(&h), C.size_t(unsafe.Sizeof(h)), d, C.size_t(len(data)), &p)
	return int64(w.c.bad_replies)
}
