//go:build ucx && cgo

package ucx

/*
#cgo pkg-config: ucx
#include <stdlib.h>
#include "cx.h"
*/
import "C"

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/connex/connex/transport"
)

// GETs posted to UCX: the read path for every key no same-host copy
// serves (get.go dispatches). The whole batch goes to the owner thread in
// one closure and one cgo call (worker.post); checked and shared keys are
// read through the holder's request/reply protocol, onesided and RMA keys
// with raw ucp_get_nbx.

// post serves a Get with GETs posted to UCX on the owner thread, in one
// batch: the holder's checked protocol for checked and shared keys, raw
// ucp_get_nbx for onesided and RMA keys. It waits for the batch, or cancels
// it when ctx ends. holders are the shared keys' holders on this host,
// checked before and after.
func (h *Endpoint) post(ctx context.Context, ops []transport.GetOp, keys []keyInfo, runs []run, holders []procID) error {
	e, w := h.e, h.e.b.w
	for _, p := range holders {
		if err := checkAlive(p); err != nil {
			return err
		}
	}
	bt := h.e.b.buildBatch(ops, keys, runs)
	if len(holders) > 0 {
		h.e.shared.Store(true)
	}
	if !w.submit(func() {
		u, err := e.current()
		if err != nil {
			w.finish(bt, err)
			return
		}
		w.post(bt, u)
	}) {
		C.free(unsafe.Pointer(bt.c))
		C.free(unsafe.Pointer(bt.ops))
		bt.pin.Unpin()
		return transport.ErrClosed
	}
	err := w.await(ctx, bt)
	if err == nil && bt.local {
		for _, p := range holders {
			if err := checkAlive(p); err != nil {
				return err
			}
		}
	}
	return err
}

// await waits for a submitted batch's result, cancels it when ctx ends,
// and settles it when the worker stops: a batch whose closure the stopped
// loop never ran (queued after its last look at its commands) has no
// result coming.
func (w *worker) await(ctx context.Context, bt *batch) error {
	select {
	case err := <-bt.result:
		return wrapGet(err)
	case <-w.done:
		return w.settleStopped(bt)
	case <-ctx.Done():
	}
	why := transport.CtxErr(ctx.Err())
	w.submit(func() { w.cancel(bt, why) })
	t := time.NewTimer(cancelGrace)
	defer t.Stop()
	select {
	case err := <-bt.result:
		if err == nil { // completed just before the cancel
			return nil
		}
		return wrapGet(err)
	case <-w.done:
		return w.settleStopped(bt)
	case <-t.C:
		// UCX still holds the destination buffers; they stay pinned.
		return fmt.Errorf("ucx: get: %w (UCX did not release the buffers within %v)", why, cancelGrace)
	}
}

// settleStopped is the outcome of batch bt once its worker has stopped:
// its result if the loop ran it (every batch it ran has one by now, the
// shutdown's leaked ones included), else ErrClosed, its C memory freed and
// its destinations unpinned — it never reached UCX.
func (w *worker) settleStopped(bt *batch) error {
	select {
	case err := <-bt.result:
		return wrapGet(err)
	default:
	}
	C.free(unsafe.Pointer(bt.c))
	C.free(unsafe.Pointer(bt.ops))
	bt.c, bt.ops = nil, nil
	bt.pin.Unpin()
	return transport.ErrClosed
}

func wrapGet(err error) error { return err }

// buildBatch splits runs into GETs of at most Config.ChunkBytes and builds
// the C batch.
func (b *Backend) buildBatch(ops []transport.GetOp, keys []keyInfo, runs []run) *batch {
	total := 0
	for _, r := range runs {
		total += chunks(r.n, b.chunk)
	}
	bt := &batch{n: total, result: make(chan error, 1)}
	for _, k := range keys {
		bk := batchKey{rkey: k.rk.rkey, base: k.rk.base} // rkey nil for checked keys
		if k.rk.kind == keyShared {
			bk.shared = k.rk.sharedCacheKey()
		}
		bt.keys = append(bt.keys, bk)
	}
	bt.c = (*C.cx_batch)(C.calloc(1, C.sizeof_cx_batch))
	bt.ops = (*C.cx_get)(C.calloc(C.size_t(total), C.sizeof_cx_get))
	cops := bt.opsSlice()
	j := 0
	for _, r := range runs {
		for off := uint64(0); off < r.n; {
			n := r.n - off
			if b.chunk > 0 && n > b.chunk {
				n = b.chunk
			}
			k := &keys[r.key].rk
			cops[j] = C.cx_get{
				local:  C.uint64_t(r.local + off),
				remote: C.uint64_t(r.remote + off),
				len:    C.uint64_t(n),
				rkey:   C.uint64_t(r.key),
				reg:    C.uint64_t(k.reg),
				token:  C.uint64_t(k.token),
			}
			j++
			off += n
		}
	}
	// UCX writes into the destinations after this goroutine moved on; pin
	// them (a no-op for mmap'd memory) so they stay put and alive.
	for i := range ops {
		if len(ops[i].Dst) > 0 {
			bt.pin.Pin(&ops[i].Dst[0])
		}
	}
	return bt
}

func chunks(n, chunk uint64) int {
	if chunk == 0 {
		return 1
	}
	return int((n + chunk - 1) / chunk)
}
