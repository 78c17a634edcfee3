package tcp

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/connex/connex/transport"
)

// chunk is one request's worth of a GetOp, or of a strided op whose pieces
// are contiguous at the holder (scatter.go).
type chunk struct {
	op    int // index into the caller's ops, for error context
	key   remoteKey
	off   uint64
	dst   []byte
	to    scatter // where the payload lands in dst
	tries int
}

// planChunks validates ops and splits them into requests of at most max
// bytes. A zero-length op still becomes one request, so its key and offset
// are checked by the holder like any other.
func planChunks(ops []transport.GetOp, max int) ([]chunk, error) {
	n := 0
	for i := range ops {
		n += 1 + len(ops[i].Dst)/max
	}
	chunks := make([]chunk, 0, n)
	var lastKey []byte
	var key remoteKey
	for i, op := range ops {
		if lastKey == nil || string(op.RemoteKey) != string(lastKey) {
			k, err := decodeKey(op.RemoteKey)
			if err != nil {
				return nil, fmt.Errorf("op %d: %w", i, err)
			}
			key, lastKey = k, op.RemoteKey
		}
		if end := op.RemoteAddr + uint64(len(op.Dst)); end < op.RemoteAddr {
			return nil, fmt.Errorf("op %d: range %d+%d overflows: %w", i, op.RemoteAddr, len(op.Dst), transport.ErrNotRegistered)
		}
		dst, off := op.Dst, op.RemoteAddr
		for {
			m := min(len(dst), max)
			chunks = append(chunks, chunk{op: i, key: key, off: off, dst: dst[:m:m], to: scatter{n: m}})
			dst, off = dst[m:], off+uint64(m)
			if len(dst) == 0 {
				break
			}
		}
	}
	return chunks, nil
}

// getCall is the state one Get shares with the connection readers.
type getCall struct {
	// done receives every sent request exactly once. Its capacity is the
	// call's request window, so readers never block on it, even after the
	// Get has returned and stopped receiving.
	done  chan *pendingReq
	start int64 // monoNow when the Get started
}

// abandonMode says why a Get stops early.
type abandonMode int

const (
	abandonFailed abandonMode = iota // an op failed
	abandonCtx                       // ctx ended: also cut connections that look frozen
	abandonClosed                    // the Endpoint was closed
)

// get runs one Get: it keeps up to the window of chunks in flight, spread
// over the endpoint's connections, and resends chunks whose connection was
// cut on behalf of another Get. progress, if not nil, hears of each chunk
// that completed.
func (e *endpoint) get(ctx context.Context, closed <-chan struct{}, ops []transport.GetOp, progress func(n int)) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("tcp get %s: %w", e.addr, transport.CtxErr(err))
	}
	chunks, err := planChunks(ops, e.b.cfg.ChunkBytes)
	if err != nil {
		return fmt.Errorf("tcp get %s: %w", e.addr, err)
	}
	return e.getChunks(ctx, closed, e.gather(chunks), progress)
}

// getStrided is get of strided ops (planStrided).
func (e *endpoint) getStrided(ctx context.Context, closed <-chan struct{}, ops []transport.StridedOp, progress func(n int)) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("tcp get %s: %w", e.addr, transport.CtxErr(err))
	}
	chunks, err := planStrided(ops, e.b.cfg.ChunkBytes)
	if err != nil {
		return fmt.Errorf("tcp get %s: %w", e.addr, err)
	}
	return e.getChunks(ctx, closed, e.gather(chunks), progress)
}

// gather packs chunks into GATHER requests where the holder speaks protocol
// version 2 (gatherChunks); a Get on an endpoint whose holder has not
// answered a hello yet sends plain GETs.
func (e *endpoint) gather(chunks []chunk) []chunk {
	if !e.gathers() || len(chunks) < 2 {
		return chunks
	}
	return gatherChunks(chunks, e.b.cfg.ChunkBytes, 4*len(e.slots))
}

// getChunks is get of planned chunks.
func (e *endpoint) getChunks(ctx context.Context, closed <-chan struct{}, chunks []chunk, progress func(n int)) error {
	cfg := &e.b.cfg
	if len(chunks) == 0 {
		return nil
	}
	maxOps := min(cfg.WindowOps, len(chunks))
	call := &getCall{done: make(chan *pendingReq, maxOps), start: monoNow()}
	nslots := len(e.slots)

	var (
		inflight      = make([]*pendingReq, 0, maxOps)
		inflightBytes int
		next          int   // next chunk never sent
		resend        []int // chunks to send again
		remaining     = len(chunks)
		perSlot       = make([][]*pendingReq, nslots)
		slot          = int(e.rr.Add(1)) % nslots
	)
	// watch ticks while requests are out, to find connections gone silent
	// under them (hedge.go; cuts counts the ones this Get cut) and to tell
	// progress that bytes are arriving on them (heard: the newest receive
	// seen), so that a slow link is not taken for a stalled one between two
	// completed chunks.
	var (
		watch <-chan time.Time
		cuts  int
		heard = call.start
	)
	if cfg.HedgeAfter > 0 || progress != nil {
		every := watchEvery
		if cfg.HedgeAfter > 0 {
			every = cfg.HedgeAfter / 4
		}
		t := time.NewTicker(every)
		defer t.Stop()
		watch = t.C
	}
	fail := func(mode abandonMode, err error) error {
		e.abandon(call, inflight, mode)
		return err
	}
	// handle accounts for one completion; it returns a non-nil error when
	// the Get must stop.
	handle := func(r *pendingReq) error {
		inflight, inflightBytes = dropInflight(inflight, r), inflightBytes-r.to.n
		if r.err == nil {
			remaining--
			if progress != nil {
				progress(r.to.n)
			}
			return nil
		}
		if errors.Is(r.err, errGatherRefused) {
			// Its parts go again as chunks of their own (GETs), sent
			// when the refill reaches them; not a try.
			g := chunks[r.chunk]
			for _, p := range g.to.parts {
				chunks = append(chunks, chunk{op: g.op, key: g.key, off: p.off, dst: p.dst, to: scatter{n: p.n, piece: p.piece, stride: p.stride}, tries: g.tries})
			}
			remaining += len(g.to.parts) - 1
			return nil
		}
		ch := &chunks[r.chunk]
		if errors.Is(r.err, errConnSilent) {
			resend = append(resend, r.chunk) // not a try: see hedge.go
			return nil
		}
		if (errors.Is(r.err, errConnAborted) || errors.Is(r.err, errConnLost)) && ch.tries < maxTries {
			ch.tries++
			resend = append(resend, r.chunk)
			return nil
		}
		err := r.err
		if errors.Is(err, errConnAborted) {
			err = fmt.Errorf("%w: %w", transport.ErrPeerGone, err)
		}
		what := "op"
		if ch.to.parts != nil {
			what = fmt.Sprintf("a GATHER of %d ranges from op", len(ch.to.parts))
		}
		return fail(abandonFailed, fmt.Errorf("tcp get %s: %s %d (key %d, offset %d, %d bytes): %w",
			e.addr, what, ch.op, ch.key.id, ch.off, ch.to.n, err))
	}
	for remaining > 0 {
		// Refill the window once it is half empty, so requests go out in
		// batches (one write per connection) rather than one per answer.
		if len(inflight) <= maxOps/2 && inflightBytes <= cfg.WindowBytes/2 {
			for len(inflight) < maxOps && (next < len(chunks) || len(resend) > 0) {
				i, again := next, len(resend) > 0
				if again {
					i = resend[len(resend)-1]
				}
				n := chunks[i].to.n
				if inflightBytes > 0 && inflightBytes+n > cfg.WindowBytes {
					break
				}
				if again {
					resend = resend[:len(resend)-1]
				} else {
					next++
				}
				ch := &chunks[i]
				r := &pendingReq{call: call, chunk: i, key: ch.key, off: ch.off, dst: ch.dst, to: ch.to, slot: len(inflight)}
				inflight = append(inflight, r)
				inflightBytes += n
				s := slot
				if again {
					s = e.liveSlot(slot) // away from a cut connection
				}
				perSlot[s] = append(perSlot[s], r)
				slot = (slot + 1) % nslots
			}
			for s := range perSlot {
				if len(perSlot[s]) == 0 {
					continue
				}
				err := e.sendSlot(ctx, s, perSlot[s])
				if err != nil {
					// Nothing of this slot's batch was sent: forget it.
					for _, r := range perSlot[s] {
						inflight, inflightBytes = dropInflight(inflight, r), inflightBytes-r.to.n
					}
				}
				sent := monoNow()
				for _, r := range perSlot[s] {
					r.sent = sent
				}
				clear(perSlot[s])
				perSlot[s] = perSlot[s][:0]
				if err != nil {
					mode := abandonFailed
					if ctx.Err() != nil {
						mode = abandonCtx
					}
					return fail(mode, fmt.Errorf("tcp get %s: %w", e.addr, err))
				}
			}
		}

		select {
		case r := <-call.done:
			if err := handle(r); err != nil {
				return err
			}
		case <-watch:
			now := monoNow()
			if last := lastHeard(inflight); last > heard {
				heard = last
				if progress != nil {
					progress(0)
				}
			}
			if cfg.HedgeAfter <= 0 {
				break
			}
			for _, c := range silentConns(inflight, now, int64(cfg.HedgeAfter)) {
				if cuts < nslots && e.cutSilent(c, time.Duration(now-c.lastRecv.Load())) {
					cuts++
				}
			}
		case <-ctx.Done():
			return fail(abandonCtx, fmt.Errorf("tcp get %s: %d of %d requests outstanding: %w",
				e.addr, remaining, len(chunks), transport.CtxErr(ctx.Err())))
		case <-closed:
			return fail(abandonClosed, fmt.Errorf("tcp get %s: %w", e.addr, transport.ErrClosed))
		}
		// Take every completion that is already there before refilling.
	drain:
		for remaining > 0 {
			select {
			case r := <-call.done:
				if err := handle(r); err != nil {
					return err
				}
			default:
				break drain
			}
		}
	}
	return nil
}

// dropInflight removes r from the in-flight list in O(1).
func dropInflight(inflight []*pendingReq, r *pendingReq) []*pendingReq {
	last := len(inflight) - 1
	moved := inflight[last]
	inflight[r.slot] = moved
	moved.slot = r.slot
	inflight[last] = nil
	return inflight[:last]
}

// sendSlot sends reqs on slot s's connection, redialing once if the
// connection turned out to be dead.
func (e *endpoint) sendSlot(ctx context.Context, s int, reqs []*pendingReq) error {
	for attempt := 0; ; attempt++ {
		c, err := e.conn(ctx, s)
		if err != nil {
			return err
		}
		err = c.send(ctx, reqs)
		if err != errConnDead {
			return err
		}
		if attempt == 2 {
			return fmt.Errorf("%w: connections keep failing", transport.ErrPeerGone)
		}
	}
}

// A Get that ends by its context cuts a connection that looks frozen: it has
// received nothing for stallAfter, not even since the Get started, or it has
// piled up more than maxAbandoned unanswered requests of Gets that gave up.
// Cutting drops the backlog a frozen peer would stream (and the reader
// discard) once it wakes up, and bounds the pending table. The cost of a
// wrong guess is small: the other Gets on the connection resend their
// requests on a fresh one.
const (
	stallAfter   = time.Second
	maxAbandoned = 4096
)

// abandon makes sure no connection writes into the Dst of any request in
// inflight once it returns. Requests are marked abandoned (their payloads are
// discarded on arrival); a reader decoding one of them right now is kicked
// out of its read (see rideKick) and acknowledges by completing the request,
// which abandon awaits. That takes microseconds even against a frozen peer,
// and leaves the connection to the other Gets sharing it. A Get that ends
// by its context also cuts connections that look frozen (stallAfter).
func (e *endpoint) abandon(call *getCall, inflight []*pendingReq, mode abandonMode) {
	var (
		seen = make(map[*clientConn]bool)
		wait = make(map[*pendingReq]bool)
		cut  []*clientConn
		now  = monoNow()
	)
	var cancels []uint64
	for _, r := range inflight {
		c := r.conn
		if c == nil || seen[c] {
			continue
		}
		seen[c] = true
		c.mu.Lock()
		cancels = cancels[:0]
		for _, q := range inflight {
			if q.conn == c {
				// Those whose header the reader has yet to see are
				// counted (the reader uncounts them) and canceled.
				if !q.abandoned && c.pending[q.id] == q && c.current != q {
					cancels = append(cancels, q.id)
				}
				q.abandoned = true
			}
		}
		ours := len(cancels)
		if cur := c.current; cur != nil && cur.call == call {
			wait[cur] = true
			c.kicked = true
			_ = c.nc.SetReadDeadline(aLongTimeAgo)
		}
		c.abandoned += ours
		last := c.lastRecv.Load()
		stalled := mode == abandonCtx &&
			(last < call.start && time.Duration(now-last) > stallAfter || c.abandoned > maxAbandoned)
		c.mu.Unlock()
		if stalled {
			cut = append(cut, c)
		} else if len(cancels) > 0 {
			c.cancel(cancels)
		}
	}
	for len(wait) > 0 {
		delete(wait, <-call.done)
	}
	for _, c := range cut {
		c.abort(errConnAborted)
	}
}
