package pull

import (
	"cmp"
	"context"
	"sync"
	"sync/atomic"

	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/transport"
	"github.com/connex/connex/transport/memcopy"
)

// A staged pull in one pass: where the data plane shows the holder's
// memory in place (transport.Viewer: UCX, for a holder on this host whose
// memory is a shared allocation), each tile is regrouped straight from the
// holder's spans into the destination (kvmem.Transfer.RegroupFrom), with
// no read into scratch first. Through scratch every byte moves twice, and
// the read alone costs as much as a whole pull that moves blocks whole.

// viewFunc shows a pull the holder's memory: it calls fn with views[i]
// holding the bytes of ranges[i] (transport.Viewer.View) and ctx, which fn
// checks between pieces of its work, and returns fn's error, or handled
// false without calling fn when the data plane cannot show these ranges
// (they are then read with batchReader.get). Its errors are the pull's.
type viewFunc func(ranges []transport.ViewRange, fn func(ctx context.Context, views [][]byte) error) (handled bool, err error)

// viewBytes is how much of the holder's memory one view shows (whole
// tiles; one tile where a tile is larger): a read batch's worth, so that
// each view is bounded by the stall deadline as a batch is, the holder is
// checked alive as often, and the ranges of a view stay a short list.
const viewBytes = batchBytes

// viewReader is the pull's viewFunc through v, under ctx: each view must
// end within the stall deadline (Pull.Stall), as each batch of reads from
// an endpoint without progress reports must, and fails the pull as a
// failed batch does (batchErr; landed counts the bytes of the views that
// ended well).
func (a *puller) viewReader(ctx context.Context, v transport.Viewer, total uint64, member string) viewFunc {
	var landed uint64
	return func(ranges []transport.ViewRange, fn func(context.Context, [][]byte) error) (bool, error) {
		vctx, cancel := context.WithTimeout(ctx, a.p.Stall)
		defer cancel()
		handled, err := v.View(vctx, ranges, func(views [][]byte) error { return fn(vctx, views) })
		if err != nil {
			return true, a.batchErr(ctx, vctx, err, landed, total, member)
		}
		if handled {
			for _, r := range ranges {
				landed += r.Len
			}
		}
		return handled, nil
	}
}

// viewed regroups a staged pull from views of the holder's memory (view),
// viewBytes of tiles at a time, each view's tiles spread over regroup
// goroutines (regroupViews). It returns how many tiles it regrouped, in
// pull order (layer by layer, tile by tile): all, or those before the
// first view the data plane did not handle (the caller reads the rest
// into scratch), or those before an error, which ends the pull.
func (p *translatedPlan) viewed(view viewFunc) (done int, err error) {
	x, tiles := p.x, p.x.Tiles()
	n := int(x.T.Src.Layers) * tiles
	limit := cmp.Or(p.window, viewBytes)
	// Made at the first view handled: a holder whose memory the data
	// plane cannot show (another host) is read through scratch instead.
	var bufs [][]byte
	var (
		ranges []transport.ViewRange
		starts []int // the view's tile j reads ranges[starts[j]:starts[j+1]]
	)
	for done < n {
		ranges, starts = ranges[:0], starts[:0]
		end, size := done, uint64(0)
		for ; end < n; end++ {
			layer, k := uint32(end/tiles), end%tiles
			ts := x.TileScratch(k)
			if end > done && size+ts > limit {
				break
			}
			starts = append(starts, len(ranges))
			x.StagedReads(layer, k, func(m kvmem.Move) {
				key, addr := p.srcs[m.Rank].at(m.Layer, m.Plane, m.SrcPos, m.SrcOff)
				ranges = append(ranges, transport.ViewRange{RemoteKey: key, RemoteAddr: addr, Len: m.Len})
			})
			size += ts
		}
		starts = append(starts, len(ranges))
		first := done
		handled, err := view(ranges, func(ctx context.Context, views [][]byte) error {
			if bufs == nil {
				bufs = make([][]byte, max(cmp.Or(p.workers, regroupWorkers()), 1))
				for i := range bufs {
					bufs[i] = make([]byte, x.RegroupBytes())
				}
			}
			return p.regroupViews(ctx, first, starts, views, bufs)
		})
		if err != nil || !handled {
			return done, err
		}
		done = end
	}
	return done, nil
}

// regroupViews regroups one view's tiles into the destination: tile
// first+j of the pull from views[starts[j]:starts[j+1]] (its reads' bytes),
// on this goroutine and len(bufs)-1 more (one buf each, for
// kvmem.Transfer.RegroupFrom's dense ranges), each taking the next tile in
// turn. Destination bytes go out with streaming stores where a tile fills
// a range whole, as the staged regroup's do. Once ctx ended no tile is
// begun, and it returns CtxErr; it returns only once every goroutine it
// started has exited, the views then no longer touched.
func (p *translatedPlan) regroupViews(ctx context.Context, first int, starts []int, views [][]byte, bufs [][]byte) error {
	x, tiles, dstMem := p.x, p.x.Tiles(), p.dst.Region.Bytes()
	count := len(starts) - 1
	var (
		next    atomic.Int64
		stopped atomic.Bool
	)
	done := ctx.Done()
	work := func(buf []byte) {
		// Order the streaming stores before the view ends, which the
		// pull's end waits for.
		defer memcopy.Fence()
		for !stopped.Load() {
			j := int(next.Add(1) - 1)
			if j >= count {
				return
			}
			select {
			case <-done:
				stopped.Store(true)
				return
			default:
			}
			i := first + j
			x.RegroupFrom(uint32(i/tiles), i%tiles, dstMem, views[starts[j]:starts[j+1]], buf, streamOut)
		}
	}
	var wg sync.WaitGroup
	for _, buf := range bufs[1:min(len(bufs), count)] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work(buf)
		}()
	}
	work(bufs[0])
	wg.Wait()
	if stopped.Load() {
		return transport.CtxErr(ctx.Err())
	}
	return nil
}
