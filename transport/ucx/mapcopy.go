//go:build ucx && cgo

package ucx

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/connex/connex/transport"
	"github.com/connex/connex/transport/memcopy"
)

// The copies of a mapped read (mapread.go): a Get's or a strided Get's
// pieces, from where the holder's segments are mapped here into the
// destination, in grains of about mapPieceBytes that up to mapMaxCopiers
// goroutines take in turn, so that small pieces (32 KiB KV blocks, 1 KiB
// head ranges) cost no synchronisation each; ctx is checked between
// grains. Streaming (non-temporal) stores: pulled bytes are for the engine,
// not this CPU; one fence per grain, not per piece.

type mapPiece struct {
	dst []byte
	src unsafe.Pointer
}

// pieceLists keeps copyMapped's piece lists between Gets: a KV pull is
// thousands of pieces per Get, and fresh memory costs a page fault per
// 4 KiB. A channel rather than a sync.Pool, which the garbage collector
// empties; lists longer than maxKeptPieces (32 bytes a piece: at most
// 8 × 512 KiB kept) are not kept.
var pieceLists = make(chan []mapPiece, 8)

const maxKeptPieces = 1 << 14

// copyMapped copies every op from its key's mapping (ptrs[i] is where key
// i's first byte is mapped; opKey from planKeys, which checked that every
// op lies in its key's extent).
func copyMapped(ctx context.Context, ops []transport.GetOp, opKey []int32, keys []keyInfo, ptrs []unsafe.Pointer) error {
	return copyPieces(ctx, func(add func(dst []byte, src unsafe.Pointer)) {
		for j, op := range ops {
			if i := opKey[j]; i >= 0 {
				add(op.Dst, unsafe.Add(ptrs[i], op.RemoteAddr-keys[i].rk.base))
			}
		}
	})
}

// stridedPos is a place in a strided Get: op's piece piece (piece ==
// Count: the op's end).
type stridedPos struct{ op, piece int }

// copyStridedMapped is copyMapped for strided ops: every piece of op j
// from key opKey[j]'s mapping (planRanges checked each op's span). The
// grains are ranges of pieces (stridedGrains), copied straight from the
// ops: a TP-2 NHD pull is 128 Ki pieces of 1 KiB, and a list of them cost
// as much CPU as their copy (its growth and the garbage collector's scans
// of its pointers). Ops whose pieces are longer than a grain go through
// copyPieces, which splits them.
func copyStridedMapped(ctx context.Context, ops []transport.StridedOp, opKey []int32, keys []keyInfo, ptrs []unsafe.Pointer) error {
	for j, op := range ops {
		if opKey[j] >= 0 && op.Len > mapPieceBytes {
			return copyStridedPieces(ctx, ops, opKey, keys, ptrs)
		}
	}
	bounds := stridedGrains(ops, opKey, mapPieceBytes)
	return copyGrains(ctx, len(bounds)-1, func(g int) {
		var pairs pairStreamer // across ops too: a TP-2 HND pull is one 16 KiB piece an op
		from, to := bounds[g], bounds[g+1]
		for j := from.op; j <= to.op && j < len(ops); j++ {
			i := opKey[j]
			if i < 0 {
				continue
			}
			op := ops[j]
			first, end := 0, op.Count
			if j == from.op {
				first = from.piece
			}
			if j == to.op {
				end = to.piece
			}
			base := unsafe.Add(ptrs[i], op.RemoteAddr-keys[i].rk.base)
			for p := first; p < end; p++ {
				d := p * op.DstStride
				pairs.copy(op.Dst[d:d+op.Len:d+op.Len], unsafe.Slice((*byte)(unsafe.Add(base, uint64(p)*op.RemoteStride)), op.Len))
			}
		}
		pairs.flush()
	})
}

// stridedGrains cuts ops (those with opKey >= 0) into grains of about
// grain bytes at piece boundaries: grain g runs from bounds[g] up to,
// not including, bounds[g+1]. The first bound is the start, the last
// {len(ops), 0}; a piece longer than grain is a grain of its own.
func stridedGrains(ops []transport.StridedOp, opKey []int32, grain int) []stridedPos {
	bounds := []stridedPos{{0, 0}}
	acc := 0
	for j, op := range ops {
		if opKey[j] < 0 || op.Len == 0 {
			continue
		}
		p := 0
		for {
			need := max((grain-acc+op.Len-1)/op.Len, 1) // pieces that fill the grain
			if p+need > op.Count {
				acc += (op.Count - p) * op.Len
				break
			}
			p += need
			acc = 0
			if p == op.Count {
				bounds = append(bounds, stridedPos{j + 1, 0})
				break
			}
			bounds = append(bounds, stridedPos{j, p})
		}
	}
	if last := bounds[len(bounds)-1]; last.op != len(ops) || len(bounds) == 1 {
		bounds = append(bounds, stridedPos{len(ops), 0})
	}
	return bounds
}

// copyStridedPieces is copyStridedMapped through a list of pieces
// (copyPieces), for ops whose pieces are longer than a grain.
func copyStridedPieces(ctx context.Context, ops []transport.StridedOp, opKey []int32, keys []keyInfo, ptrs []unsafe.Pointer) error {
	return copyPieces(ctx, func(add func(dst []byte, src unsafe.Pointer)) {
		for j, op := range ops {
			i := opKey[j]
			if i < 0 {
				continue
			}
			base := unsafe.Add(ptrs[i], op.RemoteAddr-keys[i].rk.base)
			for p := range op.Count {
				d := p * op.DstStride
				add(op.Dst[d:d+op.Len:d+op.Len], unsafe.Add(base, uint64(p)*op.RemoteStride))
			}
		}
	})
}

// copyPieces copies the pieces fill adds (a destination and where its
// bytes are mapped here), split at mapPieceBytes and grouped into grains of
// about that size.
func copyPieces(ctx context.Context, fill func(add func(dst []byte, src unsafe.Pointer))) error {
	var pieces []mapPiece
	select {
	case pieces = <-pieceLists:
	default:
	}
	defer func() {
		clear(pieces) // drop the references to the destinations
		if cap(pieces) <= maxKeptPieces {
			select {
			case pieceLists <- pieces[:0]:
			default:
			}
		}
	}()
	grains := []int{0} // grain g is pieces[grains[g]:grains[g+1]]
	acc := 0
	fill(func(dst []byte, src unsafe.Pointer) {
		for off := 0; off < len(dst); off += mapPieceBytes {
			n := min(len(dst)-off, mapPieceBytes)
			pieces = append(pieces, mapPiece{dst: dst[off : off+n], src: unsafe.Add(src, off)})
			if acc += n; acc >= mapPieceBytes {
				grains = append(grains, len(pieces))
				acc = 0
			}
		}
	})
	if grains[len(grains)-1] != len(pieces) {
		grains = append(grains, len(pieces))
	}
	return copyGrains(ctx, len(grains)-1, func(g int) {
		var pairs pairStreamer
		for _, pc := range pieces[grains[g]:grains[g+1]] {
			pairs.copy(pc.dst, unsafe.Slice((*byte)(pc.src), len(pc.dst)))
		}
		pairs.flush()
	})
}

// pairStreamer copies pieces with streaming stores, those of pairMinBytes
// and more two at a time, interleaved (memcopy.StreamPairUnfenced): a lone
// 32 KiB KV block spends a measurable share of its copy waiting for its
// first lines, which the other piece's loads then overlap. Smaller ones
// (1 KiB head ranges) go one by one: interleaved, they copied at 0.6 of
// the speed (6.6 against 11 GB/s on one core here). A large piece waits
// for the next one; flush copies the last alone.
type pairStreamer struct{ dst, src []byte }

func (p *pairStreamer) copy(dst, src []byte) {
	switch {
	case len(dst) < pairMinBytes:
		memcopy.StreamUnfenced(dst, src)
	case p.dst == nil:
		p.dst, p.src = dst, src
	default:
		memcopy.StreamPairUnfenced(p.dst, p.src, dst, src)
		p.dst, p.src = nil, nil
	}
}

func (p *pairStreamer) flush() {
	if p.dst != nil {
		memcopy.StreamUnfenced(p.dst, p.src)
		p.dst, p.src = nil, nil
	}
}

// copyGrains runs copyGrain for grains 0 … n-1 on up to
// min(n, GOMAXPROCS, mapMaxCopiers) goroutines, the caller's one of them,
// each taking the next grain in turn and fencing its streaming stores
// after each; once ctx is done no grain starts, and it returns ctx's error
// as a transport error.
func copyGrains(ctx context.Context, n int, copyGrain func(g int)) error {
	copiers := min(n, runtime.GOMAXPROCS(0), mapMaxCopiers)
	var next atomic.Int64
	done := ctx.Done()
	var canceled atomic.Bool
	work := func() {
		for {
			g := int(next.Add(1) - 1)
			if g >= n || canceled.Load() {
				return
			}
			select {
			case <-done:
				canceled.Store(true)
				return
			default:
			}
			copyGrain(g)
			memcopy.Fence()
		}
	}
	var wg sync.WaitGroup
	for range copiers - 1 {
		wg.Add(1)
		go func() { defer wg.Done(); work() }()
	}
	if copiers > 0 {
		work()
	}
	wg.Wait()
	if canceled.Load() {
		return transport.CtxErr(ctx.Err())
	}
	return nil
}
