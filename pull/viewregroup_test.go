package pull

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/kvfill"
	"github.com/connex/connex/kvmem/regionfile"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
)

// kvLayout is an engine rank's described layout (bfloat16): CPU order in
// one plane, else K and V planes.
func kvLayout(order string, layers, heads, headSize, tp, rank, bs, blocks uint32) kvmem.Layout {
	l := kvmem.Layout{Layers: layers, Planes: 2, Blocks: blocks, BlockSize: bs, TPSize: tp, TPRank: rank, Order: order,
		Heads: heads, HeadSize: headSize, Dtype: "bfloat16"}
	if order == kvmem.OrderCPU {
		l.Planes = 1
	}
	_, n := l.HeadRange()
	l.BlockBytes = uint64(n) * uint64(headSize) * 2 * uint64(bs) * uint64(3-l.Planes)
	return l
}

// holdFunc gives a holder rank size bytes of memory, registered under key
// with its first byte at addr.
type holdFunc func(tb testing.TB, rank uint32, size uint64) (mem, key []byte, addr uint64)

// localHold is memory of this process, rank r's under key {r} at address
// 0.
func localHold(_ testing.TB, rank uint32, size uint64) ([]byte, []byte, uint64) {
	return make([]byte, size), []byte{byte(rank)}, 0
}

// viewPull is a staged pull of numTokens tokens (0: all) of the hold's
// scattered blocks srcIDs, from a holder laid out as src (each rank's
// memory from hold, filled by kvfill; mem by key) into scattered blocks
// dstIDs of a region laid out as dst.
type viewPull struct {
	mem    map[string][]byte
	tokens uint32
	dstL   kvmem.Layout
	dstIDs []uint32
	dst    *kvmem.Mapped
	plan   *translatedPlan
}

func newViewPull(tb testing.TB, hold holdFunc, src, dst kvmem.Layout, nSrc int, numTokens uint32) *viewPull {
	tb.Helper()
	rng := rand.New(rand.NewPCG(uint64(nSrc), uint64(src.BlockSize)))
	srcIDs := make([]uint32, nSrc)
	for i, b := range rng.Perm(int(src.Blocks))[:nSrc] {
		srcIDs[i] = uint32(b)
	}
	tokens, nDst, err := kvmem.PullSize(src.BlockSize, nSrc, numTokens, dst.BlockSize)
	if err != nil {
		tb.Fatal(err)
	}
	g := &viewPull{mem: map[string][]byte{}, tokens: tokens, dstL: dst}
	for _, b := range rng.Perm(int(dst.Blocks))[:nDst] {
		g.dstIDs = append(g.dstIDs, uint32(b))
	}
	desc := &messages.Descriptors{BlockIds: srcIDs}
	for r := range src.TPSize {
		l := src
		l.TPRank = r
		mem, key, addr := hold(tb, r, l.Size())
		kvfill.Fill(l, mem, srcIDs)
		g.mem[string(key)] = mem
		if r == 0 {
			desc.Layout, desc.Rkeys, desc.ImpliedSegments, desc.RegionAddr = actors.LayoutToProto(l), [][]byte{key}, true, addr
		} else {
			desc.MoreRanks = append(desc.MoreRanks, &messages.RankDescriptors{Layout: actors.LayoutToProto(l), Rkeys: [][]byte{key}, ImpliedSegments: true, RegionAddr: addr})
		}
	}
	reg, err := regionfile.Create(filepath.Join(tb.TempDir(), "r"), dst)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { reg.Close() })
	g.dst = &kvmem.Mapped{Engine: "e", ID: "r", Region: reg, Blocks: kvmem.NewBlockTable(dst.Blocks)}
	tr, err := kvmem.Translate(src, dst)
	if err != nil {
		tb.Fatal(err)
	}
	if !tr.Staged {
		tb.Fatalf("%v -> %v: not staged", src, dst)
	}
	ranks, err := ranksOf(desc)
	if err != nil {
		tb.Fatal(err)
	}
	if g.plan, err = planTranslated(tr, ranks, srcIDs, 0, g.dstIDs, numTokens, g.dst, false); err != nil {
		tb.Fatal(err)
	}
	return g
}

// viewEndpoint is a holder's memory in this process (mem: each key's, at
// address 0) as a transport.Endpoint that shows it in place
// (transport.Viewer), as UCX's does for a holder on this host. Get
// copies. View shows copies of the ranges, overwritten once fn returned,
// so that a regroup that outlived its view copies wrong bytes (and the
// race detector sees it); it handles the first handle views (all when
// negative) and refuses the rest. Before fn of handled view i it calls
// before(i), after it returns after(i) as the View's error, where set.
type viewEndpoint struct {
	mem                  map[string][]byte
	handle               int
	before               func(i int)
	after                func(i int) error
	views, refused, gets atomic.Int64
}

func (e *viewEndpoint) at(key []byte, addr, n uint64) []byte {
	m := e.mem[string(key)]
	return m[addr : addr+n : addr+n]
}

func (e *viewEndpoint) Get(_ context.Context, ops []transport.GetOp) error {
	e.gets.Add(1)
	for _, op := range ops {
		copy(op.Dst, e.at(op.RemoteKey, op.RemoteAddr, uint64(len(op.Dst))))
	}
	return nil
}

func (e *viewEndpoint) GetProgress(ctx context.Context, ops []transport.GetOp, progress func(int)) error {
	return transport.ProgressAtEnd(ctx, ops, progress, e.Get)
}

func (e *viewEndpoint) GetStrided(ctx context.Context, ops []transport.StridedOp) error {
	return e.Get(ctx, transport.Pieces(ops))
}

func (e *viewEndpoint) GetStridedProgress(ctx context.Context, ops []transport.StridedOp, progress func(int)) error {
	return transport.StridedProgressAtEnd(ctx, ops, progress, e.GetStrided)
}

func (e *viewEndpoint) Close() error { return nil }

func (e *viewEndpoint) View(_ context.Context, ranges []transport.ViewRange, fn func([][]byte) error) (bool, error) {
	i := int(e.views.Load())
	if e.handle >= 0 && i >= e.handle {
		e.refused.Add(1)
		return false, nil
	}
	e.views.Add(1)
	views := make([][]byte, len(ranges))
	for j, r := range ranges {
		views[j] = bytes.Clone(e.at(r.RemoteKey, r.RemoteAddr, r.Len))
	}
	if e.before != nil {
		e.before(i)
	}
	err := fn(views)
	for _, v := range views {
		for k := range v {
			v[k] = 0xA5
		}
	}
	if err == nil && e.after != nil {
		err = e.after(i)
	}
	return true, err
}

// getsOnly hides an endpoint's View.
type getsOnly struct{ transport.Endpoint }

// viewBackend is a data plane whose endpoints show holders' memory
// (Caps.Views), as UCX's do: the puller then views where an endpoint
// handles it.
type viewBackend struct{ idleBackend }

func (viewBackend) Caps() transport.Caps { return transport.Caps{Views: true} }

// viewPuller is a puller whose reads the tests drive (batchReader), on
// b, with a stall deadline of stall.
func viewPuller(b transport.Backend, stall time.Duration) *puller {
	return &puller{deps: &PullDeps{Backend: b}, p: &Pull{ID: "t", Stall: stall}}
}

// run performs the pull through ep, an endpoint of b, into a cleared
// destination under ctx and returns the destination's bytes.
func (g *viewPull) run(ctx context.Context, b transport.Backend, ep transport.Endpoint, window uint64, workers int, stall time.Duration) ([]byte, error) {
	mem := g.dst.Region.Bytes()
	clear(mem)
	g.plan.window, g.plan.workers = window, workers
	err := g.plan.run(viewPuller(b, stall).batchReader(ctx, ep, g.plan.total(), "holder"))
	return bytes.Clone(mem), err
}

// viewGeometries are staged pulls the view tests make: the CPU order's
// block-size changes (up, with a last tile of fewer tokens, and to a size
// that is no multiple, at another TP size and rank), a TP 2 holder read
// by TP 1 (two ranks, two keys), NHD between TP sizes (head ranges too
// small to read one by one), and heads of 64 (V copies long enough to go
// out straight, not through the regroup's buffer).
func viewGeometries(tb testing.TB, hold holdFunc) map[string]*viewPull {
	cpu := func(tp, rank, bs, blocks uint32) kvmem.Layout {
		return kvLayout(kvmem.OrderCPU, 3, 4, 8, tp, rank, bs, blocks)
	}
	nhd := func(tp, bs uint32) kvmem.Layout { return kvLayout(kvmem.OrderNHD, 2, 4, 8, tp, 0, bs, 12) }
	return map[string]*viewPull{
		"cpu 16->32 part":          newViewPull(tb, hold, cpu(1, 0, 16, 12), cpu(1, 0, 32, 8), 5, 4*16+3),
		"cpu 16->32":               newViewPull(tb, hold, cpu(1, 0, 16, 12), cpu(1, 0, 32, 8), 6, 0),
		"cpu tp1 16 -> tp2.1 48":   newViewPull(tb, hold, cpu(1, 0, 16, 12), cpu(2, 1, 48, 8), 7, 0),
		"cpu tp2 16 -> tp1 32":     newViewPull(tb, hold, cpu(2, 0, 16, 12), cpu(1, 0, 32, 8), 5, 0),
		"nhd tp2 16 -> tp1 32 16B": newViewPull(tb, hold, nhd(2, 16), nhd(1, 32), 5, 0),
		"cpu head 64 16->32":       newViewPull(tb, hold, kvLayout(kvmem.OrderCPU, 2, 2, 64, 1, 0, 16, 12), kvLayout(kvmem.OrderCPU, 2, 2, 64, 1, 0, 32, 8), 7, 0),
	}
}

// TestViewRegroupMatchesStaged: a staged pull through an endpoint that
// shows the holder's memory (viewEndpoint) regroups every tile from the
// views, reading nothing with Get, and writes the destination byte for
// byte as the staged path through Get does (and as the holder had it,
// kvfill), whatever its views' size and regroup goroutines; where the
// endpoint stops handling views part way, the rest is read through
// scratch, the destination again the same.
func TestViewRegroupMatchesStaged(t *testing.T) {
	ctx := context.Background()
	for name, g := range viewGeometries(t, localHold) {
		want, err := g.run(ctx, idleBackend{}, &viewEndpoint{mem: g.mem}, 0, 0, time.Minute)
		if err != nil {
			t.Fatalf("%s: staged: %v", name, err)
		}
		if err := kvfill.Check(g.dstL, want, g.dstIDs, g.tokens, true); err != nil {
			t.Fatalf("%s: staged: %v", name, err)
		}
		tile := g.plan.x.TileScratch(0)
		tiles := int(g.plan.x.T.Src.Layers) * g.plan.x.Tiles()
		for _, window := range []uint64{1, tile, 3*tile + tile/2, 1 << 30} {
			for _, workers := range []int{-1, 1, 2, 4} {
				at := fmt.Sprintf("%s, window %d, %d workers", name, window, workers)
				ep := &viewEndpoint{mem: g.mem, handle: -1}
				got, err := g.run(ctx, viewBackend{}, ep, window, workers, time.Minute)
				if err != nil {
					t.Fatalf("%s: %v", at, err)
				}
				if ep.gets.Load() != 0 || ep.views.Load() == 0 {
					t.Fatalf("%s: %d Gets and %d views, want every tile from views", at, ep.gets.Load(), ep.views.Load())
				}
				if window == tile && ep.views.Load() != int64(tiles) {
					t.Fatalf("%s: %d views of a tile each for %d tiles", at, ep.views.Load(), tiles)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("%s: the destination differs from the staged pull's", at)
				}
			}
		}
		for _, handle := range []int{0, 1, 2} {
			ep := &viewEndpoint{mem: g.mem, handle: handle}
			got, err := g.run(ctx, viewBackend{}, ep, tile, 2, time.Minute)
			if err != nil {
				t.Fatalf("%s, %d views handled: %v", name, handle, err)
			}
			if ep.views.Load() != int64(handle) || ep.refused.Load() != 1 || ep.gets.Load() == 0 {
				t.Fatalf("%s, %d views handled: %d views, %d refused, %d Gets; want the rest read once refused", name, handle, ep.views.Load(), ep.refused.Load(), ep.gets.Load())
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s, %d views handled: the destination differs from the staged pull's", name, handle)
			}
		}
	}
}

// TestViewRegroupErrors: the first error of a view ends the pull with
// it: an error the view returns (a holder found dead after fn), the
// pull's context canceled during a view, a view longer than the stall
// deadline, a backend whose Caps promise views its endpoint lacks. No
// view follows, nothing is read with Get, and no goroutine of the pull is
// left behind.
func TestViewRegroupErrors(t *testing.T) {
	g := viewGeometries(t, localHold)["cpu 16->32"]
	tile := g.plan.x.TileScratch(0)
	boom := fmt.Errorf("holder 7 exited: %w", transport.ErrPeerGone)
	for _, workers := range []int{-1, 1, 2, 4} {
		for _, failAt := range []int{0, 1, 4} {
			at := fmt.Sprintf("%d workers, view %d", workers, failAt)
			ep := &viewEndpoint{mem: g.mem, handle: -1, after: func(i int) error {
				if i == failAt {
					return boom
				}
				return nil
			}}
			if _, err := g.run(context.Background(), viewBackend{}, ep, tile, workers, time.Minute); !errors.Is(err, transport.ErrPeerGone) {
				t.Fatalf("%s failing: %v, want the view's error", at, err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cep := &viewEndpoint{mem: g.mem, handle: -1, before: func(i int) {
				if i == failAt {
					cancel()
				}
			}}
			_, err := g.run(ctx, viewBackend{}, cep, 2*tile, workers, time.Minute)
			cancel()
			if !errors.Is(err, transport.ErrCanceled) {
				t.Fatalf("%s canceled: %v, want ErrCanceled", at, err)
			}
			for _, e := range []*viewEndpoint{ep, cep} {
				if e.views.Load() != int64(failAt+1) || e.gets.Load() != 0 {
					t.Fatalf("%s: %d views and %d Gets, want none after the failed view", at, e.views.Load(), e.gets.Load())
				}
			}
			if s := stagedGoroutines(); s != "" {
				t.Fatalf("%s: a goroutine of the pull is left:\n%s", at, s)
			}
		}
		// Caps.Views, but an endpoint that is no Viewer: the pull fails
		// with the lie instead of reading through scratch.
		liar := &viewEndpoint{mem: g.mem, handle: -1}
		if _, err := g.run(context.Background(), viewBackend{}, getsOnly{liar}, tile, workers, time.Minute); !errors.Is(err, transport.ErrCapsLie) || liar.gets.Load() != 0 {
			t.Fatalf("%d workers, Caps.Views without a Viewer: %v after %d Gets, want ErrCapsLie and none", workers, err, liar.gets.Load())
		}
		ep := &viewEndpoint{mem: g.mem, handle: -1}
		if _, err := g.run(context.Background(), viewBackend{}, ep, tile, workers, time.Nanosecond); !errors.Is(err, transport.ErrTimeout) {
			t.Fatalf("%d workers, a view past the stall deadline: %v, want ErrTimeout", workers, err)
		}
		if s := stagedGoroutines(); s != "" {
			t.Fatalf("%d workers, stalled: a goroutine of the pull is left:\n%s", workers, s)
		}
	}
}
