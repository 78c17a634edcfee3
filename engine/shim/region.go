package shim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/handover"
	"github.com/connex/connex/kvmem/regionfile"
	"github.com/connex/connex/messages"
)

// ErrRegionLost means the engine's connexd no longer has the engine's KV
// region: it restarted, and the memory it had created died with it, or the
// region broke (its memory faulted: something shrank its file). The
// engine creates a new region there at once (requests under way keep the
// old mapping until they end); the request that hit it should be resent
// elsewhere — it is not a KV-load failure, and the hold it needed is alive.
var ErrRegionLost = errors.New("shim: the engine's connexd lost its KV region (it restarted)")

// RankRegionID is the region id of TP rank rank: RegionID for rank 0,
// RegionID-tp<rank> for the others.
func (c *Config) RankRegionID(rank uint32) string {
	if rank == 0 {
		return c.RegionID
	}
	return fmt.Sprintf("%s-tp%d", c.RegionID, rank)
}

// createRegions creates the region of every TP rank of the engine
// (createRegion); on error none stays mapped.
func (e *Engine) createRegions(ctx context.Context) ([]*kvmem.Region, error) {
	var out []*kvmem.Region
	for rank := range e.cfg.Layout.TPSize {
		r, err := e.createRegion(ctx, rank)
		if err != nil {
			for _, r := range out {
				_ = r.Close()
			}
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// createRegion creates the engine's region of TP rank rank on its connexd
// and maps it, retrying while the connexd is not up yet or its region
// socket is busy.
func (e *Engine) createRegion(ctx context.Context, rank uint32) (*kvmem.Region, error) {
	cfg, l := e.cfg, e.cfg.Layout
	l.TPRank = rank
	pl := layoutToProto(l)
	regionID := cfg.RankRegionID(rank)
	var last error // why the previous try failed
	for {
		c, cancel := context.WithTimeout(ctx, max(cfg.CallTimeout, 30*time.Second))
		info, err := e.cli.CreateRegion(c, &messages.CreateRegionRequest{EngineId: cfg.EngineID, RegionId: regionID, Layout: pl})
		cancel()
		if err == nil {
			r, err := MapCreated(ctx, info, l)
			if err == nil {
				return r, nil
			}
			// A region socket whose slots are taken (a local user can
			// fill them) is worth another try with a new token.
			if !errors.Is(err, handover.ErrBusy) || ctx.Err() != nil {
				return nil, fmt.Errorf("shim: engine %s, connexd %s: %w", cfg.EngineID, cfg.Member, err)
			}
			last = err
		} else if code := api.CodeOf(err); (code != api.CodePeerUnavailable && code != api.CodeTimeout) || ctx.Err() != nil {
			return nil, fmt.Errorf("shim: region.create of engine %s on member %s: %w", cfg.EngineID, cfg.Member, err)
		} else {
			last = err
		}
		t := time.NewTimer(100 * time.Millisecond) // connexd not up yet, or its region socket busy: try again shortly
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("shim: region of engine %s on member %s: %w", cfg.EngineID, cfg.Member, last)
		case <-t.C:
		}
	}
}

// MapCreated maps the region region.create answered with info, laid out
// as l. With a region socket in the answer (handover_socket, connexd's
// default) it receives the memory's descriptor there for the one-use
// token, so the engine may run under any uid; without one (region_socket
// off, or an older connexd) it opens info.Path, /proc/<connexd pid>/fd/<n>,
// which only connexd's own uid (and root) may open.
func MapCreated(ctx context.Context, info *messages.RegionInfo, l kvmem.Layout) (*kvmem.Region, error) {
	if info.HandoverSocket == "" {
		r, err := regionfile.Attach(info.Path, l)
		if err != nil {
			return nil, fmt.Errorf("map the created region at %s (no region socket in region.create's answer): %w", info.Path, err)
		}
		return populated(r), nil
	}
	f, err := handover.Receive(ctx, info.HandoverSocket, info.EngineId, info.RegionId, info.HandoverToken)
	if err != nil {
		return nil, fmt.Errorf("receive the created region %s: %w", info.RegionId, err)
	}
	defer f.Close() // the mapping keeps the memory
	name := cmp.Or(info.Path, "region "+info.RegionId+" from "+info.HandoverSocket)
	r, err := regionfile.AttachFile(f, name, l)
	if err != nil {
		return nil, fmt.Errorf("map the created region %s received from %s: %w", info.RegionId, info.HandoverSocket, err)
	}
	return populated(r), nil
}

// populated faults in every page of the engine's own mapping of r now, as
// an engine allocating its KV cache up front does, instead of on the first
// load or compute that touches each page: connexd populated its mapping at
// region.create, but each process's page tables are its own. Measured on a
// 2 GiB llama3-8b region with 4 KiB pages: an 8192-token Load check took
// ~50 ms on a fresh mapping and 1.2 ms on a populated one (populating cost
// ~0.4 s once); on the resume path that is time the client waits.
func populated(r *kvmem.Region) *kvmem.Region {
	regionfile.Populate(r.Bytes())
	return r
}

// regionLost starts (once at a time) the re-creation of the engine's
// region after its connexd lost it: a new region from the new connexd;
// blocks that holds of the old connexd kept come back (those holds died
// with it); new requests use the new region.
func (e *Engine) regionLost(why string) {
	e.mu.Lock()
	if e.recovering || e.closed {
		e.mu.Unlock()
		return
	}
	e.recovering = true
	e.recoveries++
	e.mu.Unlock()
	e.log.Warn("connexd lost this engine's KV region; creating a new one", "member", e.cfg.Member, "why", why)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-e.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		rs, err := e.createRegions(ctx)
		e.mu.Lock()
		defer e.mu.Unlock()
		e.recovering = false
		if err != nil {
			e.log.Error("could not create a new KV region after connexd lost the old one; requests will fail until it can", "err", err)
			return
		}
		if e.closed {
			for _, r := range rs {
				_ = r.Close()
			}
			return
		}
		e.retired = append(e.retired, e.regions...)
		e.regions = rs
		n := e.alloc.DropHolds()
		e.signalLocked()
		e.log.Warn("new KV regions created", "path", rs[0].Path, "ranks", len(rs), "holds_dropped", n)
	}()
}

// lostRegion reports whether err says the engine's own region is unknown
// to its connexd, or broken, and if so starts its re-creation.
func (e *Engine) lostRegion(err error) bool {
	if code := api.CodeOf(err); code != api.CodeUnknownRegion && code != api.CodeRegionBroken {
		return false
	}
	e.regionLost(err.Error())
	return true
}

// layoutToProto is a layout's wire form (actors.LayoutToProto, which the
// shim may not import).
func layoutToProto(l kvmem.Layout) *messages.Layout {
	return &messages.Layout{NumLayers: l.Layers, KvPlanes: l.Planes, NumBlocks: l.Blocks, BlockBytes: l.BlockBytes, BlockSize: l.BlockSize, TpSize: l.TPSize,
		TpRank: l.TPRank, KvOrder: l.Order, NumKvHeads: l.Heads, HeadSize: l.HeadSize, Dtype: l.Dtype, Model: l.Model}
}
