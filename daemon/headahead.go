package daemon

import (
	"context"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/connex/connex/clock"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
)

// maxHeadAhead bounds the reads ahead one member keeps (one per granted
// takeover not yet started here); a grant past it is not read ahead.
const maxHeadAhead = 1024

// headAheadTTL is how long a read ahead serves the Head that takes it,
// from when it was asked: longer than a router's grant precedes the
// engine's request.start (vLLM's front end and the engine's next step,
// milliseconds), short enough that an unused one is soon gone.
const headAheadTTL = 2 * time.Second

// headAhead is a requests.Store whose Head of a request can be read ahead of the
// call that needs it (the request actors' store). A router grants a takeover (peer.grant) to the
// member of the engine it resumes a request on, then sends the engine
// the resumed leg; the engine's request.start (takeover) reaches the
// member milliseconds later and its first step is that Head. ahead reads
// it when the grant arrives; the Head that comes within headAheadTTL
// takes that read (waiting for it if it is still on its way), once.
//
// A read ahead may be stale by the time it is taken (the request's old
// engine checkpointed in between): the takeover's compare-and-set write
// then fails as fenced and the activation reads again, now from the
// store, as for any write that lost a race. A read that failed is not
// used: the Head asks the store itself.
type headAhead struct {
	requests.Store
	// Clock ages reads ahead; nil is the system clock.
	Clock clock.Clock
	// Go runs a read in the background (the daemon's tracked goroutines);
	// nil runs it on a plain goroutine.
	Go func(func())
	// Timeout bounds a read ahead.
	Timeout time.Duration

	mu    sync.Mutex
	reads map[string]*headRead
}

type headRead struct {
	asked time.Time
	done  chan struct{}
	st    *messages.RequestState
	rev   uint64
	err   error
}

// ahead starts reading request id's head, unless a read of it is
// pending or maxHeadAhead are.
func (h *headAhead) ahead(id string) {
	now := clock.Or(h.Clock).Now()
	h.mu.Lock()
	h.expire(now)
	if _, pending := h.reads[id]; pending || len(h.reads) >= maxHeadAhead {
		h.mu.Unlock()
		return
	}
	if h.reads == nil {
		h.reads = map[string]*headRead{}
	}
	r := &headRead{asked: now, done: make(chan struct{})}
	h.reads[id] = r
	h.mu.Unlock()
	read := func() {
		ctx, cancel := context.WithTimeout(context.Background(), h.Timeout)
		defer cancel()
		r.st, r.rev, r.err = h.Store.Head(ctx, id)
		close(r.done)
	}
	if h.Go != nil {
		h.Go(read)
		return
	}
	go read()
}

// Head returns request id's head: the read ahead of it when one was asked
// within headAheadTTL and succeeds, else the store's.
func (h *headAhead) Head(ctx context.Context, id string) (*messages.RequestState, uint64, error) {
	now := clock.Or(h.Clock).Now()
	h.mu.Lock()
	r := h.reads[id]
	delete(h.reads, id)
	h.mu.Unlock()
	if r == nil || now.Sub(r.asked) > headAheadTTL {
		return h.Store.Head(ctx, id)
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	if r.err != nil {
		return h.Store.Head(ctx, id)
	}
	return proto.CloneOf(r.st), r.rev, nil
}

// pending is how many reads ahead wait to be taken (metrics, tests).
func (h *headAhead) pending() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.reads)
}

// expire drops reads asked more than headAheadTTL before now. Caller
// holds mu.
func (h *headAhead) expire(now time.Time) {
	for id, r := range h.reads {
		if now.Sub(r.asked) > headAheadTTL {
			delete(h.reads, id)
		}
	}
}
