package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
)

// regionAPI answers the region calls (region.create, region.register,
// region.inspect) over this member's region table, and opens created
// regions for the region socket (kvmem/handover).
type regionAPI struct {
	table regionBook
	alloc regionMaker
	// grants hands created regions' descriptors to their engines; nil when
	// region_socket is off (or on a router).
	grants handoverGrants
	log    *slog.Logger
}

// regionBook is what regionAPI keeps its regions in (kvmem.RegionTable).
type regionBook interface {
	regionLeaser
	Lookup(engine, id string) (*kvmem.Mapped, error)
	Admit(engine string, l kvmem.Layout) error
	Add(engine, id string, r *kvmem.Region) (*kvmem.Mapped, error)
	Register(engine, id, path string, l kvmem.Layout) (*kvmem.Mapped, error)
}

// regionMaker allocates the memory of a created region (regionalloc.go).
type regionMaker interface {
	newRegion(name string, l kvmem.Layout) (*kvmem.Region, error)
}

// handoverGrants issues one-use tokens for a created region's descriptor
// (handover.Server).
type handoverGrants interface {
	Grant(engine, region string, ref any) (string, error)
	Addr() string
}

func regionInfo(m *kvmem.Mapped) *messages.RegionInfo {
	c := m.Blocks.Counts()
	return &messages.RegionInfo{
		EngineId: m.Engine, RegionId: m.ID, Path: m.Region.Path, Layout: actors.LayoutToProto(m.Region.Layout),
		Bytes: m.Region.Layout.Size(), BlocksFree: c.Free, BlocksHeld: c.Held, BlocksReading: c.Reading, BlocksWriting: c.Writing,
		Memory: m.Region.Memory,
	}
}

// CreateRegion allocates a region for an engine, which maps the returned
// path: the data plane's shared memory when it can allocate some (UCX:
// one-sided reads on this host), else a memfd. Creating the same engine,
// id and layout again returns the existing region.
func (a *regionAPI) CreateRegion(ctx context.Context, r *messages.CreateRegionRequest) (*messages.RegionInfo, error) {
	if err := engineRegionCall(ctx, &r.EngineId, r.RegionId); err != nil {
		return nil, err
	}
	l := actors.LayoutFromProto(r.Layout)
	if err := l.Validate(); err != nil {
		return nil, err
	}
	// createdAs reports whether m is a region created with layout l.
	createdAs := func(m *kvmem.Mapped) bool { return m.Region.Memory != kvmem.MemoryFile && m.Region.Layout == l }
	if m, err := a.table.Lookup(r.EngineId, r.RegionId); err == nil && !m.Broken() {
		if createdAs(m) {
			return a.createdInfo(m)
		}
		return nil, api.Errorf(api.CodeBadRequest, "region %s/%s already exists (%s, %s) with another layout or memory",
			r.EngineId, r.RegionId, m.Region.Memory, m.Region.Path)
	}
	if err := a.table.Admit(r.EngineId, l); err != nil {
		return nil, err
	}
	reg, err := a.alloc.newRegion(r.EngineId+"-"+r.RegionId, l)
	if err != nil {
		return nil, err
	}
	m, err := a.table.Add(r.EngineId, r.RegionId, reg)
	if err != nil {
		_ = reg.Close()
		// A concurrent create (a client retrying) may have won: same
		// answer as above.
		if m, lerr := a.table.Lookup(r.EngineId, r.RegionId); lerr == nil && createdAs(m) && !m.Broken() {
			return a.createdInfo(m)
		}
		return nil, api.Errorf(api.CodeBadRequest, "%v", err)
	}
	a.log.Info("region created", "engine", r.EngineId, "region", r.RegionId, "bytes", l.Size(), "memory", reg.Memory, "path", reg.Path)
	return a.createdInfo(m)
}

// RegisterRegion maps an engine's region file.
func (a *regionAPI) RegisterRegion(ctx context.Context, r *messages.RegisterRegionRequest) (*messages.RegionInfo, error) {
	if err := engineRegionCall(ctx, &r.EngineId, r.RegionId); err != nil {
		return nil, err
	}
	if r.Path == "" {
		return nil, api.Errorf(api.CodeBadRequest, "path is empty: give the region file the engine created")
	}
	m, err := a.table.Register(r.EngineId, r.RegionId, r.Path, actors.LayoutFromProto(r.Layout))
	if err != nil {
		if errors.Is(err, kvmem.ErrRegionExists) {
			return nil, api.Errorf(api.CodeBadRequest, "%v", err)
		}
		return nil, err
	}
	return regionInfo(m), nil
}

// InspectRegion returns a region's accounting.
func (a *regionAPI) InspectRegion(ctx context.Context, r *messages.RegionRef) (*messages.RegionInfo, error) {
	if err := engineRegionCall(ctx, &r.EngineId, r.RegionId); err != nil {
		return nil, err
	}
	m, err := a.table.Lookup(r.EngineId, r.RegionId)
	if err != nil {
		return nil, api.Errorf(api.CodeUnknownRegion, "%v", err)
	}
	return regionInfo(m), nil
}

// createdInfo is region.create's answer for m: the region's info and, with
// the region socket on, where and with which one-use token the calling
// engine receives the memory's descriptor (kvmem/handover). The reply goes
// only to the calling engine's inbox, so only it learns the token.
func (a *regionAPI) createdInfo(m *kvmem.Mapped) (*messages.RegionInfo, error) {
	info := regionInfo(m)
	if a.grants == nil {
		return info, nil
	}
	tok, err := a.grants.Grant(m.Engine, m.ID, m)
	if err != nil {
		return nil, fmt.Errorf("region %s/%s: %w", m.Engine, m.ID, err)
	}
	info.HandoverSocket, info.HandoverToken = a.grants.Addr(), tok
	return info, nil
}

// openCreated opens the memory of the region granted as ref, for the
// region socket to send: only while that very region (not one created
// since under the same ids) is still in the table and not broken. It holds
// a reference while it opens the region's /proc/self/fd path, so the
// descriptor that path names cannot be closed (and its number reused by
// another file) in between.
func (a *regionAPI) openCreated(engine, region string, ref any) (*os.File, error) {
	m, release, err := a.table.Acquire(engine, region)
	if err != nil {
		return nil, errors.New("the region is gone (engine.gone, or connexd dropped it): create it again")
	}
	defer release()
	if m != ref {
		return nil, errors.New("the region was created again since this token was issued: use the newer token")
	}
	if err := m.CheckBroken(); err != nil {
		return nil, errors.New("the region is broken (its memory faulted): create it again")
	}
	f, err := os.OpenFile(m.Region.Path, os.O_RDWR, 0)
	if err != nil {
		a.log.Warn("region socket: cannot open a created region's memory", "engine", engine, "region", region, "path", m.Region.Path, "err", err)
		return nil, errors.New("connexd cannot open the region's memory (its log says why)")
	}
	return f, nil
}
