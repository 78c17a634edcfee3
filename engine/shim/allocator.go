package shim

import (
	"errors"
	"fmt"
	"slices"
)

// ErrNoBlocks means the allocator has fewer free blocks than asked for.
var ErrNoBlocks = errors.New("shim: not enough free KV blocks")

// ErrTooLarge means a request needs more blocks than the region has at all.
var ErrTooLarge = errors.New("shim: more KV blocks than the region holds")

// Allocator hands out the KV blocks of one region. Blocks held for a
// transfer (prefill) come back only when the hold's blocks.freed notice
// arrives (Freed); blocks of a decode request come back when it ends
// (Free). It is pure and not safe for concurrent use: Engine guards it.
type Allocator struct {
	total  uint32
	free   []uint32
	held   map[string][]uint32 // transfer id -> blocks held for it
	early  map[string][]uint32 // blocks.freed notices that overtook their hold.create reply
	inUse  map[uint32]bool     // allocated and not yet returned
	heldBy map[uint32]string   // block -> transfer holding it
	// earlyOrder is early's ids oldest first, and recent the transfers
	// freed lately, oldest first in recentOrder (a repeated notice of one
	// is not taken for an early one): both bounded by maxNotices.
	earlyOrder  []string
	recent      map[string]bool
	recentOrder []string
}

// maxNotices bounds the early notices and the recently freed transfers an
// Allocator remembers; past it, the oldest go first.
const maxNotices = 4096

// NewAllocator returns an allocator over blocks 0..n-1, all free.
func NewAllocator(n uint32) *Allocator {
	a := &Allocator{total: n, held: map[string][]uint32{}, early: map[string][]uint32{}, inUse: map[uint32]bool{}, heldBy: map[uint32]string{}, recent: map[string]bool{}}
	// Hand out low ids first: pop from the end of a descending list.
	for b := int64(n) - 1; b >= 0; b-- {
		a.free = append(a.free, uint32(b))
	}
	return a
}

// Total is the number of blocks of the region.
func (a *Allocator) Total() uint32 { return a.total }

// FreeCount is the number of blocks free now.
func (a *Allocator) FreeCount() uint32 { return uint32(len(a.free)) }

// Alloc takes n free blocks: ErrTooLarge if the region has fewer than n
// blocks in all, ErrNoBlocks if fewer are free now.
func (a *Allocator) Alloc(n int) ([]uint32, error) {
	switch {
	case n <= 0:
		return nil, fmt.Errorf("shim: alloc of %d blocks", n)
	case uint64(n) > uint64(a.total):
		return nil, fmt.Errorf("%w: %d blocks asked, the region has %d", ErrTooLarge, n, a.total)
	case n > len(a.free):
		return nil, fmt.Errorf("%w: %d asked, %d free of %d", ErrNoBlocks, n, len(a.free), a.total)
	}
	out := make([]uint32, n)
	for i := range out {
		out[i] = a.free[len(a.free)-1-i]
		a.inUse[out[i]] = true
	}
	a.free = a.free[:len(a.free)-n]
	return out, nil
}

// Free returns blocks that are not held for a transfer (a decode request
// ended, or a prefill failed before its hold). Blocks not allocated, or
// held for a transfer, are refused with an error and not freed.
func (a *Allocator) Free(ids []uint32) error {
	for _, b := range ids {
		if !a.inUse[b] {
			return fmt.Errorf("shim: free of block %d, which is not allocated", b)
		}
	}
	for _, b := range ids {
		if t, ok := a.heldBy[b]; ok {
			return fmt.Errorf("shim: free of block %d, which is held for transfer %s (it comes back with blocks.freed)", b, t)
		}
	}
	a.give(ids)
	return nil
}

func (a *Allocator) give(ids []uint32) {
	for _, b := range ids {
		delete(a.inUse, b)
		delete(a.heldBy, b)
		a.free = append(a.free, b)
	}
}

// Hold records that allocated blocks now belong to transfer id; they come
// back with Freed(id). If the transfer's blocks.freed notice arrived before
// this call (the reply overtaken), the blocks come back at once and Hold
// reports true.
func (a *Allocator) Hold(id string, ids []uint32) (freedAlready bool, err error) {
	for _, b := range ids {
		if !a.inUse[b] {
			return false, fmt.Errorf("shim: hold %s of block %d, which is not allocated", id, b)
		}
	}
	if _, dup := a.held[id]; dup {
		return false, fmt.Errorf("shim: transfer %s is already held", id)
	}
	if _, ok := a.early[id]; ok {
		delete(a.early, id)
		a.give(ids)
		a.freedNow(id)
		return true, nil
	}
	for _, b := range ids {
		if t, ok := a.heldBy[b]; ok {
			return false, fmt.Errorf("shim: hold %s of block %d, which is held for transfer %s", id, b, t)
		}
	}
	a.held[id] = slices.Clone(ids)
	for _, b := range ids {
		a.heldBy[b] = id
	}
	return false, nil
}

// Freed hands back the blocks of transfer id (its blocks.freed notice). It
// returns how many blocks came back: 0 for a second notice of the same
// transfer (exactly once: never twice), or for a notice that overtook its
// Hold (remembered; the blocks come back at Hold).
func (a *Allocator) Freed(id string, notified []uint32) (int, error) {
	ids, ok := a.held[id]
	if !ok {
		if _, dup := a.early[id]; !dup && !a.recent[id] {
			a.early[id] = slices.Clone(notified)
			a.earlyOrder = append(a.earlyOrder, id)
			a.earlyOrder = forgetOldest(a.earlyOrder, func(old string) bool { _, ok := a.early[old]; return ok },
				func(old string) { delete(a.early, old) }, len(a.early) > maxNotices)
			if len(a.earlyOrder) > 2*len(a.early)+64 {
				// Ids taken up by Hold behind one that never was: compact.
				a.earlyOrder = slices.DeleteFunc(a.earlyOrder, func(id string) bool { _, ok := a.early[id]; return !ok })
			}
		}
		return 0, nil
	}
	delete(a.held, id)
	a.give(ids)
	a.freedNow(id)
	if !sameSet(ids, notified) {
		return len(ids), fmt.Errorf("shim: blocks.freed for %s lists blocks %v, the hold has %v (freed the hold's)", id, notified, ids)
	}
	return len(ids), nil
}

// freedNow remembers that transfer id's blocks came back, so that another
// notice of it is not kept as an early one.
func (a *Allocator) freedNow(id string) {
	a.recent[id] = true
	a.recentOrder = append(a.recentOrder, id)
	a.recentOrder = forgetOldest(a.recentOrder, func(old string) bool { return a.recent[old] },
		func(old string) { delete(a.recent, old) }, len(a.recent) > maxNotices)
}

// forgetOldest drops from the front of order the ids no longer kept (kept
// false), and, while over (re-evaluated through kept), the oldest kept one
// (drop removes it); it returns what is left of order.
func forgetOldest(order []string, kept func(string) bool, drop func(string), over bool) []string {
	for len(order) > 0 && (over || !kept(order[0])) {
		if kept(order[0]) {
			drop(order[0])
			over = false
		}
		order = order[1:]
	}
	return order
}

// HeldIDs is the transfers held now.
func (a *Allocator) HeldIDs() []string {
	ids := make([]string, 0, len(a.held))
	for id := range a.held {
		ids = append(ids, id)
	}
	return ids
}

// FreedUnless hands back the blocks of every transfer of among still held
// and not in live (the transfers connexd still holds blocks for): their
// blocks.freed notices were lost. among must be the transfers held before
// live was read, so that a hold made since is not judged by a state that
// predates it. It returns how many holds it handed back.
func (a *Allocator) FreedUnless(live map[string]bool, among []string) int {
	n := 0
	for _, id := range among {
		ids, ok := a.held[id]
		if !ok || live[id] {
			continue
		}
		delete(a.held, id)
		a.give(ids)
		a.freedNow(id)
		n++
	}
	return n
}

// DropHolds hands back the blocks of every hold, for holds that died with
// their connexd (they will never send blocks.freed), and forgets early
// notices. It returns how many holds it dropped.
func (a *Allocator) DropHolds() int {
	n := len(a.held)
	for id, ids := range a.held {
		delete(a.held, id)
		a.give(ids)
	}
	clear(a.early)
	return n
}

// Held is the number of transfers whose blocks are still held.
func (a *Allocator) Held() int { return len(a.held) }

func sameSet(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}
