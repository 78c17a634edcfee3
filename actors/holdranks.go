package actors

import (
	"errors"
	"fmt"

	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
)

// moreRanks is what the hold of a tensor-parallel engine keeps of its ranks
// 1 .. tp_size-1 (rank 0 is the hold's own region and registration): their
// regions and registrations. A hold of a single-rank engine has none (a nil
// pointer), so it costs nothing more (make bench-holds).
type moreRanks struct {
	regions []*kvmem.Mapped
	regs    []holdRegistration
	release func() // gives back the regions' references, once
}

// regions calls f with every rank's region, rank 0 first.
func (a *holdActor) regions(f func(*kvmem.Mapped)) {
	f(a.spec.region)
	if a.more != nil {
		for _, m := range a.more.regions {
			f(m)
		}
	}
}

// brokenRegion is the first rank's region that broke, as its error, or nil.
func (a *holdActor) brokenRegion() error {
	var err error
	a.regions(func(m *kvmem.Mapped) {
		if err == nil {
			err = m.CheckBroken()
		}
	})
	return err
}

// holdRanks takes the blocks in the regions of ranks 1.. (rank 0's are
// held already) and registers them with b; on error it gives back what it
// took and nothing stays registered.
func (mr *moreRanks) holdRanks(b transport.Backend, blocks []uint32) error {
	for i, m := range mr.regions {
		if err := m.Blocks.Hold(blocks); err != nil {
			mr.unhold(i, blocks)
			return fmt.Errorf("rank %d: %w", i+1, err)
		}
	}
	for i, m := range mr.regions {
		hr, err := registerHold(b, m.Region, blocks)
		if err != nil {
			mr.unhold(len(mr.regions), blocks)
			return errors.Join(fmt.Errorf("rank %d: %w", i+1, err), mr.deregister())
		}
		mr.regs = append(mr.regs, hr)
	}
	return nil
}

// unhold gives back blocks in the regions of ranks 1 .. n.
func (mr *moreRanks) unhold(n int, blocks []uint32) {
	for _, m := range mr.regions[:n] {
		_ = m.Blocks.Unhold(blocks)
	}
}

// deregister revokes the ranks' registrations (idempotent).
func (mr *moreRanks) deregister() error {
	if mr == nil {
		return nil
	}
	var errs []error
	for i := range mr.regs {
		errs = append(errs, mr.regs[i].deregisterAll())
	}
	mr.regs = nil
	return errors.Join(errs...)
}

// descriptors are the ranks' RankDescriptors for a pull.
func (mr *moreRanks) descriptors() []*messages.RankDescriptors {
	if mr == nil {
		return nil
	}
	out := make([]*messages.RankDescriptors, len(mr.regs))
	for i := range mr.regs {
		hr := &mr.regs[i]
		out[i] = &messages.RankDescriptors{
			Layout: LayoutToProto(mr.regions[i].Region.Layout), Rkeys: hr.remoteKeys(), Segments: hr.segments(),
			ImpliedSegments: hr.implied, RegionAddr: hr.regionAddr,
		}
	}
	return out
}
