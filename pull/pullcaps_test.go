package pull

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// callsEndpoint records which of its methods a puller calls, and whether
// the call had a deadline.
type callsEndpoint struct {
	mu                            sync.Mutex
	get, progress, strided        int
	getDeadline, progressDeadline bool
	stridedProgress               int
	stridedDeadline               bool
	stridedProgressDeadline       bool
}

func (e *callsEndpoint) Get(ctx context.Context, ops []transport.GetOp) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.get++
	_, e.getDeadline = ctx.Deadline()
	return nil
}

func (e *callsEndpoint) GetProgress(ctx context.Context, ops []transport.GetOp, progress func(int)) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.progress++
	_, e.progressDeadline = ctx.Deadline()
	return nil
}

func (e *callsEndpoint) GetStrided(ctx context.Context, ops []transport.StridedOp) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.strided++
	_, e.stridedDeadline = ctx.Deadline()
	return nil
}

func (e *callsEndpoint) GetStridedProgress(ctx context.Context, ops []transport.StridedOp, progress func(int)) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stridedProgress++
	_, e.stridedProgressDeadline = ctx.Deadline()
	return nil
}

func (e *callsEndpoint) Close() error { return nil }

// TestReadsChooseByCaps: the puller reads through GetProgress under its
// stall watch where the backend's Caps say Gets report progress, and
// through Get bounded by the stall deadline per batch where they do not,
// whatever methods the endpoint has; strided ops go to GetStrided only
// where Caps.Strided says it reads them natively.
func TestReadsChooseByCaps(t *testing.T) {
	a := &puller{deps: &PullDeps{}, p: &Pull{ID: "p1", Stall: time.Hour}}
	ops, total := testOps(8)
	for _, progress := range []bool{true, false} {
		ep := &callsEndpoint{}
		if err := a.readBatches(context.Background(), ep, transport.Caps{Progress: progress}, ops, total, "h1"); err != nil {
			t.Fatal(err)
		}
		if progress && (ep.progress != 1 || ep.get != 0 || ep.progressDeadline) {
			t.Errorf("Caps.Progress: %d GetProgress (deadline %v), %d Get; want one GetProgress without a deadline", ep.progress, ep.progressDeadline, ep.get)
		}
		if !progress && (ep.get != 1 || ep.progress != 0 || !ep.getDeadline) {
			t.Errorf("no Caps.Progress: %d Get (deadline %v), %d GetProgress; want one Get bounded by the stall deadline", ep.get, ep.getDeadline, ep.progress)
		}
	}
	dst := make([]byte, 4)
	sops := []transport.StridedOp{{Dst: dst, DstStride: 2, Len: 1, Count: 2}}
	ep := &callsEndpoint{}
	if err := a.readStridedBatches(context.Background(), ep, transport.Caps{Strided: true}, sops, 2, "h1"); err != nil || ep.strided != 1 || !ep.stridedDeadline {
		t.Errorf("Caps.Strided: %d GetStrided calls (deadline %v), err %v; want one bounded by the stall deadline", ep.strided, ep.stridedDeadline, err)
	}
	// A backend whose reads report progress (TCP) has its strided reads
	// watched too, not bounded per batch: a slow link is not a stalled one.
	sp := &callsEndpoint{}
	if err := a.readStridedBatches(context.Background(), sp, transport.Caps{Strided: true, Progress: true}, sops, 2, "h1"); err != nil ||
		sp.stridedProgress != 1 || sp.strided != 0 || sp.stridedProgressDeadline {
		t.Errorf("Caps.Strided and Progress: %d GetStridedProgress (deadline %v), %d GetStrided, err %v; want one GetStridedProgress without a deadline",
			sp.stridedProgress, sp.stridedProgressDeadline, sp.strided, err)
	}
}
