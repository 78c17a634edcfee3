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
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"
	"unsafe"

	"github.com/connex/connex/transport"
)

// Get performs ops with as few UCX requests as possible: adjacent ops
// (same key, contiguous remote and destination) are coalesced, ranges
// larger than Config.ChunkBytes are split, and all of them are posted with
// one cgo call and kept in flight together.
func (h *Endpoint) Get(ctx context.Context, ops []transport.GetOp) error {
	since := faults()
	err := h.get(ctx, ops)
	if err == nil {
		// shared: this endpoint read shared keys, whose segments are
		// mapped here (mapped copies, or ucp_get_nbx from them).
		err = faultedDuring(since, ops, h.e.shared.Load())
	}
	return err
}

// get is Get before the fault check.
func (h *Endpoint) get(ctx context.Context, ops []transport.GetOp) error {
	if h.closed.Load() {
		return transport.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return transport.CtxErr(err)
	}
	e, w := h.e, h.e.b.w
	keys, opKey, err := planKeys(ops)
	if err != nil || len(keys) == 0 {
		return err
	}
	// A shared key's memory stays readable after its holder died (the
	// segment is mapped here), but the hold died with it: check the holder
	// before and after reading, as for CMA. (A mapped copy checks only
	// after reading: a holder dead before is dead after, and the copy is
	// harmless.)
	holders := sharedHolders(keys)
	if len(holders) > 0 && allShared(keys) && h.e.b.cfg.SharedReads != SharedReadsGet {
		if handled, err := h.mapGet(ctx, ops, opKey, keys, holders); handled {
			return err
		}
	}
	runs := runsOf(ops, opKey)
	if p, ok := cmaTarget(keys); ok && !e.noCMA.Load() {
		var pin runtime.Pinner
		for i := range ops {
			if len(ops[i].Dst) > 0 {
				pin.Pin(&ops[i].Dst[0])
			}
		}
		err := cmaGet(ctx, p, runs)
		pin.Unpin()
		if !errors.Is(err, errCMADenied) {
			return err
		}
		// No ptrace access to the holder: use UCX from now on.
		if e.noCMA.CompareAndSwap(false, true) {
			e.b.log.Warn("ucx: one-sided CMA reads not permitted; falling back to ucp_get_nbx", "err", err)
		}
	}
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
	select {
	case err := <-bt.result:
		if err == nil && bt.local {
			for _, p := range holders {
				if err := checkAlive(p); err != nil {
					return err
				}
			}
		}
		return wrapGet(err)
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
	case <-t.C:
		// UCX still holds the destination buffers; they stay pinned.
		return fmt.Errorf("ucx: get: %w (UCX did not release the buffers within %v)", why, cancelGrace)
	}
}

func wrapGet(err error) error { return err }

type run struct {
	local, remote, n uint64
	key              int
}

type keyInfo struct {
	packed []byte
	rk     remoteKey
}

// sharedHolders lists the distinct holder processes of shared keys that
// live on this host.
func sharedHolders(keys []keyInfo) []procID {
	self, err := selfProc()
	if err != nil {
		return nil
	}
	var out []procID
	for _, k := range keys {
		if k.rk.kind == keyShared && k.rk.proc.host == self.host && !slices.Contains(out, k.rk.proc) {
			out = append(out, k.rk.proc)
		}
	}
	return out
}

// allShared reports whether every key is a shared key.
func allShared(keys []keyInfo) bool {
	for _, k := range keys {
		if k.rk.kind != keyShared {
			return false
		}
	}
	return true
}

// cmaTarget reports whether every key is a one-sided key of one process on
// this host, so that the Get can be served with process_vm_readv.
func cmaTarget(keys []keyInfo) (procID, bool) {
	self, err := selfProc()
	if err != nil || len(keys) == 0 {
		return procID{}, false
	}
	p := keys[0].rk.proc
	for _, k := range keys {
		if k.rk.kind != keyOneSided || k.rk.proc != p {
			return procID{}, false
		}
	}
	return p, p.host == self.host
}

// planKeys parses the distinct keys of ops and validates every op against
// the extent its key carries. opKey[i] is op i's key index, -1 for an empty
// op; no keys means nothing to read.
func planKeys(ops []transport.GetOp) (keys []keyInfo, opKey []int32, err error) {
	// A hold registers one extent per layer, plane and run of blocks, so a
	// scattered KV layout brings thousands of distinct keys: index them by
	// their bytes (m[string(b)] does not allocate) instead of scanning.
	index := map[string]int{}
	opKey = make([]int32, len(ops))
	last := -1
	for i := range ops {
		op := &ops[i]
		if len(op.Dst) == 0 {
			opKey[i] = -1
			continue
		}
		ki := -1
		if last >= 0 && bytes.Equal(keys[last].packed, op.RemoteKey) {
			ki = last
		} else {
			if j, ok := index[string(op.RemoteKey)]; ok {
				ki = j
			}
			if ki < 0 {
				rk, err := parseKey(op.RemoteKey)
				if err != nil {
					return nil, nil, err
				}
				keys = append(keys, keyInfo{packed: op.RemoteKey, rk: rk})
				ki = len(keys) - 1
				index[string(op.RemoteKey)] = ki
			}
		}
		last = ki
		opKey[i] = int32(ki)
		k := &keys[ki].rk
		n := uint64(len(op.Dst))
		if op.RemoteAddr < k.base || op.RemoteAddr-k.base > k.n || n > k.n-(op.RemoteAddr-k.base) {
			return nil, nil, fmt.Errorf("%w: [%#x, +%d) is outside the key's extent [%#x, +%d)",
				transport.ErrNotRegistered, op.RemoteAddr, n, k.base, k.n)
		}
	}
	return keys, opKey, nil
}

// runsOf coalesces adjacent ops (same key, contiguous remote and
// destination) into runs.
func runsOf(ops []transport.GetOp, opKey []int32) []run {
	runs := make([]run, 0, len(ops))
	for i := range ops {
		op := &ops[i]
		ki := int(opKey[i])
		if ki < 0 {
			continue
		}
		n := uint64(len(op.Dst))
		local := uint64(uintptr(unsafe.Pointer(&op.Dst[0])))
		if m := len(runs) - 1; m >= 0 {
			r := &runs[m]
			if r.key == ki && r.remote+r.n == op.RemoteAddr && r.local+r.n == local {
				r.n += n
				continue
			}
		}
		runs = append(runs, run{local: local, remote: op.RemoteAddr, n: n, key: ki})
	}
	return runs
}

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
