package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// engine plays one inference engine next to one connexd member: a KV
// region, a block allocator, and the API client of its member.
type engine struct {
	id     string
	member string
	path   string // the region file to remove at close; "" for created regions
	region *kvmem.Region
	cli    *api.Client

	mu    sync.Mutex
	free  []uint32
	avail *sync.Cond
}

// newEngine sets up the engine's region: with regions "create" its member
// allocates it (region.create) and the engine maps the returned path, with
// "file" the engine creates a file in dir and registers it.
func newEngine(ctx context.Context, nc *nats.Conn, dir, member, id, regions string, l kvmem.Layout) (*engine, error) {
	e := &engine{id: id, member: member, cli: &api.Client{NC: nc, Member: member}}
	e.avail = sync.NewCond(&e.mu)
	for b := uint32(0); b < l.Blocks; b++ {
		e.free = append(e.free, b)
	}
	pl := &messages.Layout{NumLayers: l.Layers, KvPlanes: l.Planes, NumBlocks: l.Blocks, BlockBytes: l.BlockBytes, BlockSize: l.BlockSize, TpSize: l.TPSize}
	switch regions {
	case RegionsCreate:
		info, err := e.cli.CreateRegion(ctx, &messages.CreateRegionRequest{EngineId: id, RegionId: "r0", Layout: pl})
		if err != nil {
			return nil, fmt.Errorf("create region of %s on %s: %w", id, member, err)
		}
		if e.region, err = kvmem.AttachRegion(info.Path, l); err != nil {
			return nil, fmt.Errorf("map region of %s created by %s: %w", id, member, err)
		}
	case RegionsFile:
		path := filepath.Join(dir, id+".kv")
		r, err := kvmem.CreateRegion(path, l)
		if err != nil {
			return nil, err
		}
		e.path, e.region = path, r
		if _, err := e.cli.RegisterRegion(ctx, &messages.RegisterRegionRequest{EngineId: id, RegionId: "r0", Path: path, Layout: pl}); err != nil {
			e.close()
			return nil, fmt.Errorf("register region of %s on %s: %w", id, member, err)
		}
	default:
		return nil, fmt.Errorf("chaos: regions=%q, allowed: %s, %s", regions, RegionsCreate, RegionsFile)
	}
	return e, nil
}

// alloc takes n free blocks, waiting up to wait for them.
func (e *engine) alloc(n int, wait time.Duration) ([]uint32, error) {
	deadline := time.Now().Add(wait)
	t := time.AfterFunc(wait, func() { e.mu.Lock(); e.avail.Broadcast(); e.mu.Unlock() })
	defer t.Stop()
	e.mu.Lock()
	defer e.mu.Unlock()
	for len(e.free) < n {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("engine %s: no %d free blocks within %s", e.id, n, wait)
		}
		e.avail.Wait()
	}
	out := append([]uint32(nil), e.free[len(e.free)-n:]...)
	e.free = e.free[:len(e.free)-n]
	return out, nil
}

// release gives blocks back to the allocator.
func (e *engine) release(ids []uint32) {
	e.mu.Lock()
	e.free = append(e.free, ids...)
	e.avail.Broadcast()
	e.mu.Unlock()
}

func (e *engine) freeCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.free)
}

func (e *engine) close() {
	_ = e.region.Close()
	if e.path != "" {
		_ = os.Remove(e.path)
	}
}
