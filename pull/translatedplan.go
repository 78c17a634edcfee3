package pull

import (
	"cmp"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/transport"
	"github.com/connex/connex/transport/memcopy"
)

// translatedPlan is a pull from a holder of another shape (kvmem.Translate
// said not Whole: other TP size or rank split, block size or in-block
// order). A direct translation reads every piece straight into the
// destination blocks (ops); a staged one regroups the holder's spans into
// the destination here in the puller (run): straight from the holder's
// memory where the data plane shows it in place (viewregroup.go), else
// read into scratch memory a window at a time and regrouped on arrival.
type translatedPlan struct {
	x    *kvmem.Transfer
	srcs []*source // by holder rank; nil for ranks the reader needs nothing of
	dst  *kvmem.Mapped
	ops  []transport.GetOp // direct only
	// sops: direct, on a data plane that reads strided ops (ops is then
	// empty): a head range of a token-major block is one op, not one per
	// token.
	sops []transport.StridedOp
	// window and workers, where tests set them, replace a staged pull's
	// stagedWindowBytes (and viewBytes) and regroupWorkers(); workers < 0:
	// none, each window regrouped on the reading goroutine once read (each
	// view's tiles on the viewing one).
	window  uint64
	workers int
}

// stagedWindowBytes is the scratch a staged pull reads into before it
// regroups. Small enough that a pull's windows (one per regroup goroutine
// and the one being read) take less than the one 32 MiB window (a read
// batch) it used when the regroup waited for the reads; large enough that
// a read's own costs (a batch, a data plane call) stay small against its
// bytes: in BenchmarkRegroup (128 MiB) 4 MiB windows ran faster than 1 MiB
// ones and about as fast as 8 MiB ones.
const stagedWindowBytes = 4 << 20

// maxRegroupWorkers bounds the goroutines that regroup a staged pull's
// windows, and so its scratch: (workers+1) windows.
const maxRegroupWorkers = 4

// streamOut is how a staged pull's regroup writes the destination: with
// streaming stores (memcopy), the engine's bytes, not this CPU's; whoever
// regroups ends its run of copies with memcopy.Fence.
var streamOut = kvmem.Out{
	Copy:       func(d, s []byte) { memcopy.StreamUnfenced(d, s) },
	Interleave: memcopy.InterleaveUnfenced,
}

// regroupWorkers is how many goroutines regroup a staged pull's windows
// while its reads go on: one per core this process runs on (a same-host
// data plane's reads are copies on this process's cores too), at most
// maxRegroupWorkers.
func regroupWorkers() int { return min(runtime.GOMAXPROCS(0), maxRegroupWorkers) }

// planTranslated checks the holder's ranks the translation reads from
// against the hold's block list and plans the pull of numTokens tokens
// (kvmem.PullSize) from srcIDs into dstIDs of dst: direct reads as strided
// ops where the data plane reads those (strided), else as GetOps.
func planTranslated(tr *kvmem.Translation, ranks []rankDesc, srcIDs []uint32, skip int, dstIDs []uint32, numTokens uint32, dst *kvmem.Mapped, strided bool) (*translatedPlan, error) {
	x, err := tr.ForPull(srcIDs[skip:], dstIDs, numTokens)
	if err != nil {
		return nil, err
	}
	p := &translatedPlan{x: x, srcs: make([]*source, len(ranks)), dst: dst}
	for _, r := range tr.Ranks {
		if int(r) >= len(ranks) {
			return nil, fmt.Errorf("%w: no rank %d among the holder's %d", ErrBadDescriptors, r, len(ranks))
		}
		if p.srcs[r], err = ranks[r].seal(srcIDs); err != nil {
			return nil, err
		}
		p.srcs[r].base = skip
	}
	switch {
	case !tr.Staged && strided:
		mem := dst.Region.Bytes()
		x.StridedMoves(func(m kvmem.StridedMove) {
			key, addr := p.srcs[m.Rank].at(m.Layer, m.Plane, m.SrcPos, m.SrcOff)
			end := m.DstOff + uint64(m.Count-1)*m.DstStride + m.Len
			p.sops = append(p.sops, transport.StridedOp{RemoteKey: key, RemoteAddr: addr, RemoteStride: m.SrcStride,
				Dst: mem[m.DstOff:end:end], DstStride: int(m.DstStride), Len: int(m.Len), Count: m.Count})
		})
	case !tr.Staged:
		p.ops = make([]transport.GetOp, 0, x.MaxMoves())
		x.DirectMoves(func(m kvmem.Move) {
			key, addr := p.srcs[m.Rank].at(m.Layer, m.Plane, m.SrcPos, m.SrcOff)
			p.ops = append(p.ops, transport.GetOp{RemoteKey: key, RemoteAddr: addr, Dst: dst.Region.Slice(kvmem.Extent{Off: m.DstOff, Len: m.Len})})
		})
	}
	return p, nil
}

// total is the bytes the pull writes into the destination.
func (p *translatedPlan) total() uint64 { return p.x.Bytes() }

// run performs the pull with r, which reads lists of ops (a batch runner):
// the direct ops (strided or not) at once, or a staged pull's windows
// (staged).
func (p *translatedPlan) run(r batchReader) error {
	if p.sops != nil {
		return r.strided(p.sops)
	}
	if !p.x.T.Staged {
		return r.get(p.ops)
	}
	return p.staged(r)
}

// staged performs a staged pull with r: regrouped straight from views of
// the holder's memory where r shows them (viewed, in viewregroup.go), the
// rest (every tile where it shows none) read into scratch and regrouped
// from there (stagedReads).
func (p *translatedPlan) staged(r batchReader) error {
	from := 0
	if r.view != nil {
		var err error
		if from, err = p.viewed(r.view); err != nil {
			return err
		}
	}
	return p.stagedReads(r.get, from)
}

// stagedUnit is one tile of one layer of a staged pull, read into a
// window's scratch at base.
type stagedUnit struct {
	layer uint32
	k     int
	base  uint64
}

// stagedWindow is a scratch buffer, what is read into it (ops, the
// bytes used of it, the tiles they are), and the buffer its regroup
// assembles dense ranges in (kvmem.Transfer.RegroupBytes).
type stagedWindow struct {
	scratch []byte
	ops     []transport.GetOp
	units   []stagedUnit
	used    uint64
	buf     []byte
}

// stagedReads reads a staged pull's tiles, from the from-th on (in pull
// order: layer by layer, tile by tile), into scratch windows with read and
// regroups each window into the destination once its reads landed
// (kvmem.Transfer.Regroup). The regroup is a copy of every byte the pull
// moves, as large as the read, so it does not wait for the reads to end:
// with more than one window, regroup goroutines (regroupWorkers) take each
// window as it is read, while this goroutine reads the next into another
// (workers+1 windows in all), and the reads and the regroups run on the
// cores at once. Destination bytes are written with streaming stores
// (transport/memcopy) where a tile fills a range of a block whole: the
// engine reads them, not this process. The first read error stops the
// pull: nothing is read after it, windows not yet regrouped are dropped,
// and stagedReads returns it once every regroup goroutine has exited.
func (p *translatedPlan) stagedReads(read func([]transport.GetOp) error, from int) error {
	x, tiles := p.x, p.x.Tiles()
	n := int(x.T.Src.Layers) * tiles
	if from >= n {
		return nil
	}
	full, last := x.TileScratch(0), x.TileScratch(tiles-1)
	var need uint64
	for i := from; i < n; i++ {
		need += x.TileScratch(i % tiles)
	}
	window, workers := cmp.Or(p.window, stagedWindowBytes), cmp.Or(p.workers, regroupWorkers())
	size := min(max(window, full, last), need)
	if size >= need {
		workers = 0 // one window: nothing to overlap
	}
	workers = max(workers, 0)
	dstMem := p.dst.Region.Bytes()
	var (
		failed atomic.Bool
		fault  atomic.Pointer[error] // the first regroup's fault, if any
	)
	regroup := func(w *stagedWindow) {
		if !failed.Load() {
			err := regroupFaulting(func() {
				for _, u := range w.units {
					x.Regroup(u.layer, u.k, dstMem, w.scratch[u.base:], w.buf, streamOut)
				}
				// Order the streaming stores before the window's hand-off,
				// which the pull's end waits for.
				memcopy.Fence()
			})
			if err != nil {
				fault.CompareAndSwap(nil, &err)
				failed.Store(true)
			}
		}
		w.ops, w.units, w.used = w.ops[:0], w.units[:0], 0
	}
	free := make(chan *stagedWindow, workers+1)
	for range workers + 1 {
		free <- &stagedWindow{scratch: make([]byte, size), buf: make([]byte, x.RegroupBytes())}
	}
	var (
		ready chan *stagedWindow // read windows, to the regroup goroutines
		wg    sync.WaitGroup
	)
	// flush reads w and regroups it: here without regroup goroutines,
	// else by handing it to them (started on the first flush).
	flush := func(w *stagedWindow) error {
		if err := fault.Load(); err != nil {
			return *err // nothing more is read for a destination that faulted
		}
		if err := read(w.ops); err != nil {
			return err
		}
		if workers == 0 {
			regroup(w)
			free <- w
			return nil
		}
		if ready == nil {
			ready = make(chan *stagedWindow, workers+1)
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for w := range ready {
						regroup(w)
						free <- w
					}
				}()
			}
		}
		ready <- w
		return nil
	}
	end := func(err error) error {
		if err != nil {
			failed.Store(true)
		}
		if ready != nil {
			close(ready)
			wg.Wait()
		}
		if f := fault.Load(); err == nil && f != nil {
			err = *f
		}
		return err
	}
	w := <-free
	for i := from; i < n; i++ {
		layer, k := uint32(i/tiles), i%tiles
		ts := x.TileScratch(k)
		if w.used+ts > size {
			if err := flush(w); err != nil {
				return end(err)
			}
			w = <-free
		}
		base, scratch := w.used, w.scratch
		x.StagedReads(layer, k, func(m kvmem.Move) {
			key, addr := p.srcs[m.Rank].at(m.Layer, m.Plane, m.SrcPos, m.SrcOff)
			w.ops = append(w.ops, transport.GetOp{RemoteKey: key, RemoteAddr: addr, Dst: scratch[base+m.DstOff : base+m.DstOff+m.Len : base+m.DstOff+m.Len]})
		})
		w.units = append(w.units, stagedUnit{layer: layer, k: k, base: base})
		w.used += ts
	}
	if len(w.units) > 0 {
		if err := flush(w); err != nil {
			return end(err)
		}
	}
	return end(nil)
}
