package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/clock"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
)

// countingStore is a requests.Store whose Head counts its reads, returns
// the request's epoch as its revision, and can be held back (gate).
type countingStore struct {
	requests.Store
	mu    sync.Mutex
	heads map[string]int
	epoch uint64
	err   error
	gate  chan struct{} // when set, Head waits for it
}

func (s *countingStore) Head(ctx context.Context, id string) (*messages.RequestState, uint64, error) {
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.heads[id]++
	if s.err != nil {
		return nil, 0, s.err
	}
	return &messages.RequestState{RequestId: id, Epoch: s.epoch}, s.epoch, nil
}

func (s *countingStore) reads(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.heads[id]
}

// TestHeadAhead: a takeover's head read when its grant arrived serves the
// takeover's Head once (waiting for it when it is still on its way); a
// Head without one, after its time, or after a failed read goes to the
// store; reads ahead are bounded.
func TestHeadAhead(t *testing.T) {
	fc := clock.NewFake(time.Unix(1000, 0))
	var bg sync.WaitGroup
	goBG := func(f func()) { bg.Add(1); go func() { defer bg.Done(); f() }() }
	st := &countingStore{heads: map[string]int{}, epoch: 3}
	h := &headAhead{Store: st, Clock: fc, Go: goBG, Timeout: time.Second}
	ctx := context.Background()

	// Read ahead, then taken: one read in all, its answer a copy.
	h.ahead("r1")
	bg.Wait()
	got, rev, err := h.Head(ctx, "r1")
	if err != nil || rev != 3 || got.GetEpoch() != 3 || st.reads("r1") != 1 {
		t.Fatalf("Head after a read ahead: %v rev %d %v, %d store reads; want epoch 3 from the one read", got, rev, err, st.reads("r1"))
	}
	// Taken once: the next Head reads the store.
	if _, rev, _ := h.Head(ctx, "r1"); rev != 3 || st.reads("r1") != 2 {
		t.Fatalf("a second Head: rev %d, %d store reads; want a read of its own", rev, st.reads("r1"))
	}

	// Still on its way: the Head waits for it rather than reading again.
	st.gate = make(chan struct{})
	h.ahead("r2")
	h.ahead("r2") // one read per request
	res := make(chan error, 1)
	go func() { _, _, err := h.Head(ctx, "r2"); res <- err }()
	close(st.gate)
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	bg.Wait()
	if n := st.reads("r2"); n != 1 {
		t.Fatalf("%d store reads for a Head that came while its read ahead ran, want 1", n)
	}
	st.gate = nil

	// Past its time: read again.
	h.ahead("r3")
	bg.Wait()
	fc.Advance(headAheadTTL + time.Millisecond)
	if _, _, err := h.Head(ctx, "r3"); err != nil || st.reads("r3") != 2 {
		t.Fatalf("Head after the read ahead expired: %v, %d store reads; want 2", err, st.reads("r3"))
	}

	// A failed read ahead is not used.
	st.err = errors.New("leader unavailable")
	h.ahead("r4")
	bg.Wait()
	st.err = nil
	if got, _, err := h.Head(ctx, "r4"); err != nil || got.GetRequestId() != "r4" || st.reads("r4") != 2 {
		t.Fatalf("Head after a failed read ahead: %v %v, %d store reads; want the store's answer", got, err, st.reads("r4"))
	}

	// Bounded: past maxHeadAhead pending, a grant is not read ahead; old
	// ones go when their time is up.
	for i := range maxHeadAhead + 10 {
		h.ahead(fmt.Sprint("bulk-", i))
	}
	bg.Wait()
	if n := h.pending(); n != maxHeadAhead {
		t.Fatalf("%d reads ahead pending, want at most %d", n, maxHeadAhead)
	}
	fc.Advance(headAheadTTL + time.Millisecond)
	h.ahead("r5")
	bg.Wait()
	if n := h.pending(); n != 1 {
		t.Fatalf("%d reads ahead pending after the others expired, want 1", n)
	}
}

// TestGrantReadsAhead: a router's grant of a takeover reads the request
// ahead on the member, unless the request runs there already (its actor
// holds the state; the takeover reads nothing).
func TestGrantReadsAhead(t *testing.T) {
	a, _, _ := newTestRequestAPI("r-here")
	var bg sync.WaitGroup
	st := &countingStore{heads: map[string]int{}, epoch: 2}
	a.headAhead = &headAhead{Store: st, Go: func(f func()) { bg.Add(1); go func() { defer bg.Done(); f() }() }, Timeout: time.Second}
	for _, id := range []string{"r-away", "r-here"} {
		if _, err := a.GrantTakeover(context.Background(), &messages.StartRequestMsg{RequestId: id, EngineId: "d1"}); err != nil {
			t.Fatal(err)
		}
	}
	bg.Wait()
	if away, here := st.reads("r-away"), st.reads("r-here"); away != 1 || here != 0 {
		t.Fatalf("reads ahead: %d of the request running elsewhere, %d of the one running here; want 1 and 0", away, here)
	}
}
