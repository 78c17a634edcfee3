//go:build ucx && cgo

package ucx

import (
	"bytes"
	"context"
	"fmt"
	"slices"
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

// GetProgress is Get, then one call of progress with every byte of ops
// once they all landed: UCX reports no progress within a Get (Caps.Progress
// is false), so a reader bounds each Get by its stall deadline instead.
func (h *Endpoint) GetProgress(ctx context.Context, ops []transport.GetOp, progress func(n int)) error {
	return transport.ProgressAtEnd(ctx, ops, progress, h.Get)
}

// get is Get before the fault check. It plans the batch (planKeys,
// runsOf) and hands it to one read path: copies from UCX's mapping of the
// holders' shared segments (mapread.go), process_vm_readv from one
// holder's onesided keys on this host (cma.go), or GETs posted to UCX,
// checked or raw (post.go).
func (h *Endpoint) get(ctx context.Context, ops []transport.GetOp) error {
	if h.closed.Load() {
		return transport.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return transport.CtxErr(err)
	}
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
		if handled, err := h.mapGet(keys, holders, func(ptrs []unsafe.Pointer) error { return copyMapped(ctx, ops, opKey, keys, ptrs) }); handled {
			return err
		}
	}
	runs := runsOf(ops, opKey)
	if handled, err := h.cmaRead(ctx, ops, keys, runs); handled {
		return err
	}
	return h.post(ctx, ops, keys, runs, holders)
}

// GetStridedProgress is GetStrided reporting once, at the end (no
// Caps.Progress).
func (h *Endpoint) GetStridedProgress(ctx context.Context, ops []transport.StridedOp, progress func(n int)) error {
	return transport.StridedProgressAtEnd(ctx, ops, progress, h.GetStrided)
}

// GetStrided reads strided ops (transport.Endpoint, Caps.Strided). From holders'
// shared segments mapped here each op is one piece list of the mapped copy,
// without a GetOp per piece; any other key's pieces are read as GetOps
// (Get). It checks every op (transport.StridedOp.Check) and every op's
// span against its key's extent first.
func (h *Endpoint) GetStrided(ctx context.Context, ops []transport.StridedOp) error {
	for i := range ops {
		if err := ops[i].Check(); err != nil {
			return fmt.Errorf("op %d: %w", i, err)
		}
	}
	since := faults()
	handled, err := h.getStridedMapped(ctx, ops)
	if !handled {
		var pieces []transport.GetOp
		for _, op := range ops {
			pieces = op.AppendPieces(pieces)
		}
		return h.Get(ctx, pieces)
	}
	if err == nil && faults() != since {
		spans := make([]transport.GetOp, len(ops))
		for i, op := range ops {
			spans[i].Dst = op.Dst[:(op.Count-1)*op.DstStride+op.Len]
		}
		err = faultedDuring(since, spans, true)
	}
	return err
}

// getStridedMapped is GetStrided from mapped segments; handled is false
// when some key is not a shared key mapped here.
func (h *Endpoint) getStridedMapped(ctx context.Context, ops []transport.StridedOp) (handled bool, err error) {
	if h.closed.Load() {
		return true, transport.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return true, transport.CtxErr(err)
	}
	keys, opKey, err := planRanges(len(ops), func(i int) ([]byte, uint64, uint64) {
		return ops[i].RemoteKey, ops[i].RemoteAddr, ops[i].Span() * uint64(min(ops[i].Len, 1))
	})
	if err != nil || len(keys) == 0 {
		return true, err
	}
	holders := sharedHolders(keys)
	if len(holders) == 0 || !allShared(keys) || h.e.b.cfg.SharedReads == SharedReadsGet {
		return false, nil
	}
	return h.mapGet(keys, holders, func(ptrs []unsafe.Pointer) error { return copyStridedMapped(ctx, ops, opKey, keys, ptrs) })
}

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

// planKeys parses the distinct keys of ops and validates every op against
// the extent its key carries. opKey[i] is op i's key index, -1 for an empty
// op; no keys means nothing to read.
func planKeys(ops []transport.GetOp) (keys []keyInfo, opKey []int32, err error) {
	return planRanges(len(ops), func(i int) ([]byte, uint64, uint64) {
		return ops[i].RemoteKey, ops[i].RemoteAddr, uint64(len(ops[i].Dst))
	})
}

// planRanges is planKeys for n ranges, range i being at(i): its key, remote
// address and length (a GetOp's, or the span of a strided op's pieces).
func planRanges(n int, at func(i int) (key []byte, addr, length uint64)) (keys []keyInfo, opKey []int32, err error) {
	// A hold registers one extent per layer, plane and run of blocks, so a
	// scattered KV layout brings thousands of distinct keys: index them by
	// their bytes (m[string(b)] does not allocate) instead of scanning.
	index := map[string]int{}
	opKey = make([]int32, n)
	last := -1
	for i := range n {
		key, addr, length := at(i)
		if length == 0 {
			opKey[i] = -1
			continue
		}
		ki := -1
		if last >= 0 && bytes.Equal(keys[last].packed, key) {
			ki = last
		} else {
			if j, ok := index[string(key)]; ok {
				ki = j
			}
			if ki < 0 {
				rk, err := parseKey(key)
				if err != nil {
					return nil, nil, err
				}
				keys = append(keys, keyInfo{packed: key, rk: rk})
				ki = len(keys) - 1
				index[string(key)] = ki
			}
		}
		last = ki
		opKey[i] = int32(ki)
		k := &keys[ki].rk
		if addr < k.base || addr-k.base > k.n || length > k.n-(addr-k.base) {
			return nil, nil, fmt.Errorf("%w: [%#x, +%d) is outside the key's extent [%#x, +%d)",
				transport.ErrNotRegistered, addr, length, k.base, k.n)
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
