package actors

import (
	"fmt"
	"sort"

	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
)

// holdRegistration is a hold's data-plane registrations and what its
// descriptors tell readers about them.
type holdRegistration struct {
	b    transport.Backend // that made regs
	regs []transport.Registration
	// perExtent is set for one registration per extent: their keys and
	// segments, built once (not per pull). An implied registration has
	// none: remoteKeys asks it for its key per pull, so that a live hold
	// keeps neither a second copy of it nor these fields (make bench-holds).
	*perExtent
	// implied: one registration covers every extent (Caps.OneKeyForExtents);
	// descriptors then carry regionAddr instead of a segment list.
	implied    bool
	regionAddr uint64
}

// perExtent is what the descriptors of a hold registered extent by extent
// carry: a key per extent and its segment.
type perExtent struct {
	rkeys [][]byte
	segs  []*messages.Segment
}

// registerHold registers the extents of blocks in region with b, choosing
// the strategy from b's Caps: one key over every extent where the backend
// gives one for this memory (descriptors stay small however scattered the
// blocks are), else one registration per extent (layer × plane × run of
// blocks), in the layout's order. On error nothing stays registered.
func registerHold(b transport.Backend, region *kvmem.Region, blocks []uint32) (holdRegistration, error) {
	hr := holdRegistration{b: b}
	exts := region.Layout.Extents(blocks)
	allocated := region.Memory == kvmem.MemoryAllocated(b.Name())
	if b.Caps().OneKeyForExtents(allocated) {
		xr, err := transport.Promised[transport.ExtentRegistrar](b, "ExtentKeys")
		if err != nil {
			return holdRegistration{}, err
		}
		sorted := make([]transport.Extent, len(exts))
		for i, e := range exts {
			sorted[i] = transport.Extent{Off: e.Off, Len: e.Len}
		}
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].Off < sorted[j].Off })
		reg, err := xr.RegisterExtents(region.Bytes(), sorted)
		if err != nil {
			return holdRegistration{}, fmt.Errorf("register %d extents: %w", len(sorted), err)
		}
		hr.regs = []transport.Registration{reg}
		hr.implied, hr.regionAddr = true, reg.RemoteAddr()
		return hr, nil
	}
	// One key per extent: in one call where the backend registers many
	// at once (Caps.ManyRegister).
	mems := make([][]byte, len(exts))
	for i, e := range exts {
		mems[i] = region.Slice(e)
	}
	regs, err := transport.RegisterEach(b, mems)
	if err != nil {
		return holdRegistration{}, fmt.Errorf("register %d extents one key each: %w", len(exts), err)
	}
	for i, reg := range regs {
		hr.addExtent(reg, exts[i].Len)
	}
	return hr, nil
}

// addExtent adds reg, the registration of one extent of n bytes, with its
// segment.
func (hr *holdRegistration) addExtent(reg transport.Registration, n uint64) {
	if hr.perExtent == nil {
		hr.perExtent = &perExtent{}
	}
	hr.regs = append(hr.regs, reg)
	hr.rkeys = append(hr.rkeys, reg.RemoteKey())
	hr.segs = append(hr.segs, &messages.Segment{RemoteAddr: reg.RemoteAddr(), Length: n, Rkey: uint32(len(hr.rkeys) - 1)})
}

// remoteKeys are the keys readers name in the descriptors' segments (one,
// for an implied registration); none once deregistered.
func (hr *holdRegistration) remoteKeys() [][]byte {
	if hr.implied && len(hr.regs) == 1 {
		return [][]byte{hr.regs[0].RemoteKey()}
	}
	if hr.perExtent == nil {
		return nil
	}
	return hr.rkeys
}

// segments are the per-extent registrations' segments; none for an
// implied one.
func (hr *holdRegistration) segments() []*messages.Segment {
	if hr.perExtent == nil {
		return nil
	}
	return hr.segs
}

// deregisterAll revokes every registration in hr, returning the failures:
// in one call where the backend deregisters many at once (a hold of
// onesided UCX keys has one per extent, tens of thousands).
func (hr *holdRegistration) deregisterAll() error {
	if len(hr.regs) == 0 {
		return nil // none made (or already revoked): hr.b may be unset
	}
	err := transport.DeregisterEach(hr.b, hr.regs)
	hr.regs = nil
	return err
}
