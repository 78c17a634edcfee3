package pull

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/kvfill"
	"github.com/connex/connex/kvmem/regionfile"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
)

// cpuLayout is a vLLM CPU-order engine (K transposed per block: a pull
// between block sizes is staged) of layers layers, heads KV heads of
// headSize bfloat16 elements, blocks blocks of bs tokens, at TP 1.
func cpuLayout(layers, heads, headSize, bs, blocks uint32) kvmem.Layout {
	return kvmem.Layout{Layers: layers, Planes: 1, Blocks: blocks, BlockSize: bs, TPSize: 1, Order: kvmem.OrderCPU,
		Heads: heads, HeadSize: headSize, Dtype: "bfloat16", BlockBytes: uint64(heads) * uint64(headSize) * 2 * uint64(bs) * 2}
}

// regroupPull is a staged pull of every token of the hold's blocks srcIDs
// of a CPU-order holder of blocks of 16 tokens (its memory: src, at
// address 0 under key 0) into dstIDs of a region of blocks of 32.
type regroupPull struct {
	src    []byte
	srcIDs []uint32
	dstL   kvmem.Layout
	dstIDs []uint32
	dst    *kvmem.Mapped
	plan   *translatedPlan
}

func newRegroupPull(tb testing.TB, layers, heads, headSize uint32, nSrc int) *regroupPull {
	tb.Helper()
	sl := cpuLayout(layers, heads, headSize, 16, uint32(2*nSrc))
	g := &regroupPull{src: make([]byte, sl.Size()), dstL: cpuLayout(layers, heads, headSize, 32, uint32(nSrc))}
	// Scattered blocks on both sides, in a mixed order.
	for i := range nSrc {
		g.srcIDs = append(g.srcIDs, uint32(2*((i*7)%nSrc)+1))
	}
	for i := range (nSrc + 1) / 2 {
		g.dstIDs = append(g.dstIDs, uint32((i*2+1)%nSrc))
	}
	kvfill.Fill(sl, g.src, g.srcIDs)
	r, err := regionfile.Create(filepath.Join(tb.TempDir(), "r"), g.dstL)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	g.dst = &kvmem.Mapped{Engine: "e", ID: "r", Region: r, Blocks: kvmem.NewBlockTable(g.dstL.Blocks)}
	tr, err := kvmem.Translate(sl, g.dstL)
	if err != nil {
		tb.Fatal(err)
	}
	if !tr.Staged {
		tb.Fatal("a CPU-order pull between block sizes must be staged")
	}
	desc := &messages.Descriptors{Layout: actors.LayoutToProto(sl), BlockIds: g.srcIDs, ImpliedSegments: true, Rkeys: [][]byte{{0}}}
	ranks, err := ranksOf(desc)
	if err != nil {
		tb.Fatal(err)
	}
	if g.plan, err = planTranslated(tr, ranks, g.srcIDs, 0, g.dstIDs, 0, g.dst, false); err != nil {
		tb.Fatal(err)
	}
	return g
}

// get reads ops from the holder's memory, as a same-host data plane does.
func (g *regroupPull) get(ops []transport.GetOp) error {
	for _, op := range ops {
		copy(op.Dst, g.src[op.RemoteAddr:])
	}
	return nil
}

// TestRegroupWindows: a staged pull writes the same bytes whatever its
// window (one tile, a few tiles, a size no tile count fills, the whole
// pull and more) and however many goroutines regroup (none, one, several):
// every element where the holder had it, nothing else.
func TestRegroupWindows(t *testing.T) {
	g := newRegroupPull(t, 3, 2, 8, 5) // 3 tiles a layer, the last a part
	tile := g.plan.x.TileScratch(0)
	var want []byte
	for _, window := range []uint64{1, tile, 2 * tile, 3*tile + tile/2, 7 * tile, 1 << 30} {
		for _, workers := range []int{-1, 1, 2, 4} {
			mem := g.dst.Region.Bytes()
			clear(mem)
			g.plan.window, g.plan.workers = window, workers
			reads := 0
			if err := g.plan.run(batchReader{get: func(ops []transport.GetOp) error { reads++; return g.get(ops) }}); err != nil {
				t.Fatal(err)
			}
			if err := kvfill.Check(g.dstL, mem, g.dstIDs, uint32(len(g.srcIDs))*16, true); err != nil {
				t.Fatalf("window %d, %d workers: %v", window, workers, err)
			}
			if want == nil {
				want = bytes.Clone(mem)
			} else if !bytes.Equal(mem, want) {
				t.Fatalf("window %d, %d workers: the destination differs from the first run's", window, workers)
			}
			if window == tile && reads != 3*3 {
				t.Fatalf("window of one tile: %d reads, want 9 (3 layers of 3 tiles)", reads)
			}
		}
	}
}

// TestRegroupReadError: a read's error stops a staged pull, its regroup
// pipelined or not: no read after it, the pull returns that error, and no
// goroutine of the pull is left behind.
func TestRegroupReadError(t *testing.T) {
	g := newRegroupPull(t, 3, 2, 8, 5)
	boom := errors.New("holder gone")
	for _, workers := range []int{-1, 1, 2} {
		for _, failAt := range []int{1, 2, 5, 9} {
			g.plan.window, g.plan.workers = g.plan.x.TileScratch(0), workers
			reads := 0
			err := g.plan.run(batchReader{get: func(ops []transport.GetOp) error {
				if reads++; reads == failAt {
					return fmt.Errorf("read %d: %w", reads, boom)
				}
				return g.get(ops)
			}})
			if !errors.Is(err, boom) {
				t.Fatalf("%d workers, failing read %d: got %v, want the read's error", workers, failAt, err)
			}
			if reads != failAt {
				t.Fatalf("%d workers, failing read %d: %d reads, want none after the failure", workers, failAt, reads)
			}
			if s := stagedGoroutines(); s != "" {
				t.Fatalf("%d workers, failing read %d: a goroutine of the pull is left:\n%s", workers, failAt, s)
			}
		}
	}
}

// stagedGoroutines is the stacks of goroutines running in a staged pull
// ("" when none). One that has signalled its end may still be on its way
// out: it is given scheduler turns (a count, not a time) to go.
func stagedGoroutines() string {
	var left []string
	for range 1000 {
		buf := make([]byte, 1<<20)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				buf = buf[:n]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		left = left[:0]
		for _, s := range strings.Split(string(buf), "\n\n") {
			if (strings.Contains(s, "(*translatedPlan).staged") || strings.Contains(s, "(*translatedPlan).regroupViews")) && !strings.Contains(s, "stagedGoroutines") {
				left = append(left, s)
			}
		}
		if len(left) == 0 {
			return ""
		}
		runtime.Gosched()
	}
	return strings.Join(left, "\n\n")
}

// BenchmarkRegroup measures a staged pull of 128 MiB (the HETERO bench's
// cpu-bs16->32 case: 32 layers, 8 KV heads of 128 bfloat16, 1024 tokens in
// 64 blocks of 16 into blocks of 32) in this process, its reads copies
// from the holder's memory as a same-host data plane's are, by window and
// regroup goroutines (-1: none, 0: the default); view=: the pull in one
// pass, regrouped from views of the holder's memory (viewBytes a view),
// by regroup goroutines.
func BenchmarkRegroup(b *testing.B) {
	g := newRegroupPull(b, 32, 8, 128, 64)
	for _, window := range []uint64{1 << 20, stagedWindowBytes, 32 << 20} {
		for _, workers := range []int{-1, 1, 0} {
			b.Run(fmt.Sprintf("window=%dKiB/workers=%d", window>>10, workers), func(b *testing.B) {
				g.plan.window, g.plan.workers = window, workers
				b.SetBytes(int64(g.plan.total()))
				for b.Loop() {
					if err := g.plan.run(batchReader{get: g.get}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
	view := func(ranges []transport.ViewRange, fn func(context.Context, [][]byte) error) (bool, error) {
		views := make([][]byte, len(ranges))
		for i, r := range ranges {
			views[i] = g.src[r.RemoteAddr : r.RemoteAddr+r.Len]
		}
		return true, fn(context.Background(), views)
	}
	for _, workers := range []int{-1, 1, 0} {
		b.Run(fmt.Sprintf("view/workers=%d", workers), func(b *testing.B) {
			g.plan.window, g.plan.workers = 0, workers
			b.SetBytes(int64(g.plan.total()))
			for b.Loop() {
				if err := g.plan.run(batchReader{get: g.get, view: view}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
