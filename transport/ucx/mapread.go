//go:build ucx && cgo

package ucx

/*
#include "cx.h"
*/
import "C"

import (
	"maps"
	"sync"
	"time"
	"unsafe"
)

// Mapped reads: a Get whose keys are all shared keys of holders on this
// host, and whose segments UCX has mapped into this process, copies
// straight from the mappings (ucp_rkey_ptr) on the calling goroutine and up
// to GOMAXPROCS-1 helpers, instead of posting ucp_get_nbx on the owner
// thread (the copies: mapcopy.go). Both are one-sided loads from the same
// UCX mapping; this way the copy is not serialised on one thread, streams
// (non-temporal stores), and costs no UCX request per piece. Config.SharedReads = SharedReadsGet keeps ucp_get_nbx.

const (
	// mapPieceBytes splits long ranges so that several goroutines share
	// them and a canceled Get stops within one piece.
	mapPieceBytes = 1 << 20
	// mapMaxCopiers bounds the goroutines one Get copies with.
	mapMaxCopiers = 4
	// pairMinBytes is the smallest piece copied interleaved with the next
	// (StreamPairUnfenced); smaller ones are copied alone.
	pairMinBytes = 8 << 10
)

// mapState is an endpoint's view of the segments its current UCP endpoint
// mapped, for mapped copies that run off the owner thread. Guarded by mu;
// the owner thread takes mu only briefly.
type mapState struct {
	mu   sync.Mutex
	u    *uep               // the UCP endpoint segs belong to; nil once released
	segs map[string]segment // by shared cache key (allocation id + rkey)
	// unmapped lists the allocations u could not map (another host, no
	// shared-memory transport): their Gets go straight to the checked
	// path, without a round trip to the owner thread first.
	unmapped map[string]bool
}

// segment is where one holder allocation is mapped here: remote address
// base is at ptr. Every registration in the allocation shares it.
type segment struct {
	ptr     unsafe.Pointer
	base    uint64
	lastUse time.Time // for evictIdle
}

// at is where remote address addr of the segment is mapped here.
func (s segment) at(addr uint64) unsafe.Pointer {
	return unsafe.Add(s.ptr, int64(addr-s.base)) // may be negative: addr below the base key's
}

// lookup returns where every key's base is mapped and takes a copy
// reference on their endpoint, or ok=false when one is not cached; unmapped
// reports that some key is known not to be mappable here.
func (m *mapState) lookup(keys []keyInfo, ptrs []unsafe.Pointer) (u *uep, ok, unmapped bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.u == nil {
		return nil, false, false
	}
	now := time.Now()
	for i, k := range keys {
		ck := k.rk.sharedCacheKey()
		if m.unmapped[ck] {
			return nil, false, true
		}
		sg, ok := m.segs[ck]
		if !ok {
			return nil, false, false
		}
		ptrs[i] = sg.at(k.rk.base)
		sg.lastUse = now
		m.segs[ck] = sg
	}
	m.u.copying++
	return m.u, true, false
}

// evictIdle forgets the segments of u not used for idle, unless a mapped
// copy is running, and returns their cache keys: the owner thread then
// destroys their rkeys, unmapping a holder allocation that may long be
// freed (a busy endpoint never lingers out). Called on the owner thread.
func (m *mapState) evictIdle(u *uep, idle time.Duration) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.u != u || u.copying > 0 {
		return nil
	}
	clear(m.unmapped) // the owner thread retries them
	var out []string
	now := time.Now()
	for ck, sg := range m.segs {
		if now.Sub(sg.lastUse) >= idle {
			delete(m.segs, ck)
			out = append(out, ck)
		}
	}
	return out
}

// done drops a copy reference taken on u; it reports whether u was
// released meanwhile and this was its last copy, so that the caller must
// have the owner thread destroy u's shared rkeys.
func (m *mapState) done(u *uep) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	u.copying--
	return u.copying == 0 && u.released
}

// mapGet serves a Get's reads from mapped segments: read copies them,
// given where each key's first byte is mapped here. handled is false when
// some key's memory is not mapped here (the caller then posts a batch,
// which reads such keys through their checked registration).
func (h *Endpoint) mapGet(keys []keyInfo, holders []procID, read func(ptrs []unsafe.Pointer) error) (handled bool, err error) {
	e, w := h.e, h.e.b.w
	ms := &e.maps
	ptrs := make([]unsafe.Pointer, len(keys))
	u, ok, unmapped := ms.lookup(keys, ptrs)
	if unmapped {
		return false, nil
	}
	if !ok {
		// Unpack the rkeys on the owner thread (UCX maps the segments
		// then) and publish where they are mapped.
		var rerr error
		local := true
		if cerr := w.call(func() {
			var cu *uep
			cu, rerr = e.current()
			if rerr != nil {
				return
			}
			ms.mu.Lock()
			if ms.u != cu {
				ms.u, ms.segs, ms.unmapped = cu, map[string]segment{}, map[string]bool{}
			}
			ms.mu.Unlock()
			found := make(map[string]segment, len(keys))
			now := time.Now()
			for i, k := range keys {
				ck := k.rk.sharedCacheKey()
				sg, ok := found[ck]
				if !ok {
					_, p, ok := w.sharedRkey(cu, ck, k.rk.rkey, k.rk.base)
					if !ok {
						local = false
						ms.mu.Lock()
						if ms.u == cu {
							ms.unmapped[ck] = true
						}
						ms.mu.Unlock()
						return
					}
					sg = segment{ptr: p, base: k.rk.base, lastUse: now}
					found[ck] = sg
				}
				ptrs[i] = sg.at(k.rk.base)
			}
			ms.mu.Lock()
			maps.Copy(ms.segs, found)
			cu.copying++
			u = cu
			ms.mu.Unlock()
		}); cerr != nil {
			return true, cerr
		}
		if rerr != nil {
			return true, rerr
		}
		if !local {
			return false, nil
		}
	}
	e.shared.Store(true)
	e.b.mappedGets.Add(1)
	err = read(ptrs)
	if ms.done(u) {
		w.submit(func() { w.dropShared(u) })
	}
	if err != nil {
		return true, err
	}
	for _, p := range holders {
		if err := checkAlive(p); err != nil {
			return true, err
		}
	}
	return true, nil
}
