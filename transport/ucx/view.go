//go:build ucx && cgo

package ucx

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/connex/connex/transport"
)

// Views (transport.Viewer): the holders' shared segments UCX mapped here,
// shown to the caller in place instead of copied by a Get (mapread.go).
// The same keys qualify as for a mapped Get, with the same reference on
// the mapping while the caller reads, and the same checks after it.

var _ transport.Viewer = (*Endpoint)(nil)

// View calls fn with views of ranges in the holders' memory mapped here
// (transport.Viewer): every range's key must be a shared key of a holder
// on this host, and Config.SharedReads not SharedReadsGet; else handled
// is false. The mapping stays referenced while fn runs; after fn every
// holder is checked alive, and a fault during fn fails the View with
// transport.ErrFault.
func (h *Endpoint) View(ctx context.Context, ranges []transport.ViewRange, fn func(views [][]byte) error) (handled bool, err error) {
	if h.closed.Load() {
		return true, transport.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return true, transport.CtxErr(err)
	}
	keys, rangeKey, err := planRanges(len(ranges), func(i int) ([]byte, uint64, uint64) {
		return ranges[i].RemoteKey, ranges[i].RemoteAddr, ranges[i].Len
	})
	if err != nil {
		return true, err
	}
	views := make([][]byte, len(ranges))
	if len(keys) == 0 {
		return true, fn(views)
	}
	holders := sharedHolders(keys)
	if len(holders) == 0 || !allShared(keys) || h.e.b.cfg.SharedReads == SharedReadsGet {
		return false, nil
	}
	since := faults()
	handled, err = h.mapGet(keys, holders, func(ptrs []unsafe.Pointer) error {
		for i, r := range ranges {
			if ki := rangeKey[i]; ki >= 0 {
				views[i] = unsafe.Slice((*byte)(unsafe.Add(ptrs[ki], r.RemoteAddr-keys[ki].rk.base)), r.Len)
			}
		}
		defer clear(views) // no view outlives fn here
		return fn(views)
	})
	if handled && err == nil && faults() != since {
		err = fmt.Errorf("%w: a mapped segment or a destination faulted during the view", transport.ErrFault)
	}
	return handled, err
}
