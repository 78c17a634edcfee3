package pull

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/connex/connex/transport"
)

// A pull's reads, once planned: batches of at most batchBytes and
// batchOps, batchesInFlight at a time, under the stall rule (stallwatch.go).

// batchBytes is how many bytes one batch of reads carries. Against an
// endpoint without progress reports each batch must complete within
// Pull.Stall, which is how a frozen holder is detected without bounding the
// whole pull by the stall time (stallWatch measures progress instead where
// the endpoint reports it); at the slowest data plane here (~1 GB/s) a
// batch takes ~32 ms.
const batchBytes = 32 << 20

// batchOps bounds the reads in one batch too: a scattered hold of tiny
// blocks has hundreds of thousands of reads, and per-read costs, not bytes,
// then decide how long a batch takes.
const batchOps = 4096

// batchesInFlight is how many read batches run at once, so that the data
// plane never drains between two batches.
const batchesInFlight = 2

// maxOpBytes is the largest GetOp a pull hands the data plane: the batch
// size, or the backend's Caps.MaxGetBytes where that is smaller.
func maxOpBytes(caps transport.Caps) int {
	if caps.MaxGetBytes > 0 && caps.MaxGetBytes < batchBytes {
		return caps.MaxGetBytes
	}
	return batchBytes
}

// readBatches reads ops in batches of at most batchBytes, batchesInFlight
// at a time. Against a backend whose endpoints report progress
// (Caps.Progress) the reads fail once
// no byte has landed for the stall deadline (stallWatch); against one that
// does not, each batch must complete within it. The first error cancels the
// rest.
func (a *puller) readBatches(ctx context.Context, ep transport.Endpoint, caps transport.Caps, ops []transport.GetOp, total uint64, member string) error {
	var batches []readBatch
	for len(ops) > 0 {
		n, size := 0, uint64(0)
		for n < len(ops) && (n == 0 || (n < batchOps && size+uint64(len(ops[n].Dst)) <= batchBytes)) {
			size += uint64(len(ops[n].Dst))
			n++
		}
		batches = append(batches, readBatch{ops: ops[:n], bytes: size})
		ops = ops[n:]
	}
	return a.runBatches(ctx, ep, caps.Progress, batches, total, member)
}

// readStridedBatches is readBatches for strided ops, on an endpoint that
// reads them (Caps.Strided): batches of at most batchBytes and batchOps
// ops (each op a head range: many pieces).
func (a *puller) readStridedBatches(ctx context.Context, ep transport.Endpoint, caps transport.Caps, ops []transport.StridedOp, total uint64, member string) error {
	var batches []readBatch
	for len(ops) > 0 {
		n, size := 0, uint64(0)
		for n < len(ops) {
			b := uint64(ops[n].Count) * uint64(ops[n].Len)
			if n > 0 && (n >= batchOps || size+b > batchBytes) {
				break
			}
			size += b
			n++
		}
		batches = append(batches, readBatch{strided: ops[:n], bytes: size})
		ops = ops[n:]
	}
	return a.runBatches(ctx, ep, caps.Progress, batches, total, member)
}

// readBatch is one batch of reads: GetOps, or strided ops (either watched
// for progress where Caps.Progress says bytes are reported as they land,
// else each batch bounded by the stall deadline).
type readBatch struct {
	ops     []transport.GetOp
	strided []transport.StridedOp
	bytes   uint64
}

// runBatches reads batches, batchesInFlight at a time (readBatches);
// progressive is the backend's Caps.Progress: GetOps report bytes as they
// land, and a stall watch replaces each batch's deadline.
func (a *puller) runBatches(ctx context.Context, ep transport.Endpoint, progressive bool, batches []readBatch, total uint64, member string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch := newStallWatch(a.deps.clock(), a.p.Stall)
	readCtx := ctx // what the Gets run under
	if progressive {
		wctx, stalled := context.WithCancelCause(ctx)
		defer stalled(nil)
		defer watch.start(stalled)()
		readCtx = wctx
	}
	var (
		mu      sync.Mutex
		firstEr error
		wg      sync.WaitGroup
	)
	doBatch := func(b readBatch) {
		var err error
		switch {
		case progressive && b.strided == nil:
			err = ep.GetProgress(readCtx, b.ops, watch.progress)
		case progressive:
			err = ep.GetStridedProgress(readCtx, b.strided, watch.progress)
		default:
			bctx, bcancel := context.WithTimeout(readCtx, a.p.Stall)
			if b.strided != nil {
				err = ep.GetStrided(bctx, b.strided)
			} else {
				err = ep.Get(bctx, b.ops)
			}
			bcancel()
			if err == nil {
				watch.landed.Add(b.bytes)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			if firstEr == nil {
				firstEr = a.batchErr(ctx, readCtx, err, watch.landed.Load(), total, member)
			}
			cancel()
		}
	}
	sem := make(chan struct{}, batchesInFlight)
	launched := 0
	for i, b := range batches {
		select {
		case sem <- struct{}{}:
		case <-readCtx.Done():
		}
		if readCtx.Err() != nil {
			break
		}
		launched++
		if i == len(batches)-1 {
			// The last batch (a small pull's only one) on this goroutine:
			// no hand-off to a goroutine and back.
			doBatch(b)
			<-sem
			break
		}
		wg.Add(1)
		go func(b readBatch) {
			defer wg.Done()
			defer func() { <-sem }()
			doBatch(b)
		}(b)
	}
	wg.Wait()
	// Every batch launched and none failed: the pull is complete, even if
	// ctx ended as the last Get returned (a departure or shutdown that
	// arrived too late to matter).
	if firstEr == nil && launched < len(batches) {
		firstEr = a.batchErr(ctx, readCtx, readCtx.Err(), watch.landed.Load(), total, member)
	}
	return firstEr
}

// batchErr is the error of a pull whose batch failed with err after landed
// of total bytes: a stall (the watch's cause on readCtx, or a batch's own
// deadline) is a timeout that says so, anything else keeps its cause.
func (a *puller) batchErr(ctx, readCtx context.Context, err error, landed, total uint64, member string) error {
	stalled := errors.Is(context.Cause(readCtx), errStalled) ||
		errors.Is(transport.CtxErr(err), transport.ErrTimeout)
	if ctx.Err() == nil && stalled {
		return fmt.Errorf("pull %s: holder %s made no progress for %s after %d of %d bytes: %w",
			a.p.ID, member, a.p.Stall, landed, total, errors.Join(transport.ErrTimeout, err))
	}
	return fmt.Errorf("pull %s: read %d bytes from %s after %d: %w", a.p.ID, total, member, landed, readErr(ctx, err))
}

// splitOps cuts ops larger than max into pieces of at most max bytes, so
// that every batch of reads is bounded and the stall deadline measures
// progress rather than the size of one extent.
func splitOps(ops []transport.GetOp, max int) []transport.GetOp {
	if !slices.ContainsFunc(ops, func(op transport.GetOp) bool { return len(op.Dst) > max }) {
		return ops
	}
	out := make([]transport.GetOp, 0, len(ops))
	for _, op := range ops {
		for len(op.Dst) > max {
			out = append(out, transport.GetOp{RemoteKey: op.RemoteKey, RemoteAddr: op.RemoteAddr, Dst: op.Dst[:max:max]})
			op.RemoteAddr += uint64(max)
			op.Dst = op.Dst[max:]
		}
		out = append(out, op)
	}
	return out
}
