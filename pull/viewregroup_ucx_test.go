//go:build ucx && cgo

package pull

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/kvmem/kvfill"
	"github.com/connex/connex/transport"
	"github.com/connex/connex/transport/ucx"
)

// countedEndpoint counts an endpoint's Gets and keeps its View.
type countedEndpoint struct {
	transport.Endpoint
	gets atomic.Int64
}

func (e *countedEndpoint) Get(ctx context.Context, ops []transport.GetOp) error {
	e.gets.Add(1)
	return e.Endpoint.Get(ctx, ops)
}

func (e *countedEndpoint) GetProgress(ctx context.Context, ops []transport.GetOp, progress func(int)) error {
	e.gets.Add(1)
	return e.Endpoint.GetProgress(ctx, ops, progress)
}

func (e *countedEndpoint) View(ctx context.Context, ranges []transport.ViewRange, fn func([][]byte) error) (bool, error) {
	return e.Endpoint.(transport.Viewer).View(ctx, ranges, fn)
}

// TestViewRegroupUCX: staged pulls from a UCX holder whose ranks' memory
// is a shared allocation (in this process: UCX maps it all the same)
// regroup from UCX's mapping of the holder's memory, without a Get, into
// the destination the staged path through Gets writes, byte for byte.
func TestViewRegroupUCX(t *testing.T) {
	open := func(cfg ucx.Config) *ucx.Backend {
		b, err := ucx.OpenConfig(transport.Options{}, cfg)
		if err != nil {
			t.Fatalf("UCX: %v", err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	h, r := open(ucx.Config{}), open(ucx.Config{SharedReads: ucx.SharedReadsMap})
	if !r.Caps().Views {
		t.Fatal("a UCX reader of shared keys by mapping does not claim Caps.Views")
	}
	hold := func(tb testing.TB, _ uint32, size uint64) ([]byte, []byte, uint64) {
		a, err := h.Allocate(int(size))
		if err != nil {
			tb.Fatal(err)
		}
		reg, err := h.Register(a.Bytes())
		if err != nil {
			a.Free()
			tb.Fatal(err)
		}
		tb.Cleanup(func() {
			reg.Deregister()
			a.Free()
		})
		return a.Bytes(), reg.RemoteKey(), reg.RemoteAddr()
	}
	ep, err := r.Connect(context.Background(), h.Address())
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	ctx := context.Background()
	for name, g := range viewGeometries(t, hold) {
		// A backend without Caps.Views: the staged path, through Gets.
		want, err := g.run(ctx, idleBackend{}, ep, 0, 0, time.Minute)
		if err != nil {
			t.Fatalf("%s: staged: %v", name, err)
		}
		if err := kvfill.Check(g.dstL, want, g.dstIDs, g.tokens, true); err != nil {
			t.Fatalf("%s: staged: %v", name, err)
		}
		tile := g.plan.x.TileScratch(0)
		for _, window := range []uint64{tile, 1 << 30} {
			for _, workers := range []int{-1, 2} {
				cep := &countedEndpoint{Endpoint: ep}
				got, err := g.run(ctx, r, cep, window, workers, time.Minute)
				if err != nil {
					t.Fatalf("%s, window %d, %d workers: %v", name, window, workers, err)
				}
				if n := cep.gets.Load(); n != 0 {
					t.Fatalf("%s, window %d, %d workers: %d Gets, want every tile regrouped from the mapping", name, window, workers, n)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("%s, window %d, %d workers: the destination differs from the staged pull's", name, window, workers)
				}
			}
		}
	}
}
