//go:build ucx && cgo

package ucx

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/connex/connex/transport"
)

// endpoint is the shared, refcounted state behind Endpoint handles to one
// address. u is loop-owned.
type endpoint struct {
	b      *Backend
	key    string
	addr   []byte // ucx worker address
	refs   int    // under b.mu
	u      *uep
	noCMA  atomic.Bool // process_vm_readv was refused: use UCX
	shared atomic.Bool // a Get used shared keys: linger after the last Close
	// up is set while u is connected and not closing (owner thread:
	// current sets it, closeEP clears it), so that Connect to an endpoint
	// that is up already does not wait for the owner thread, which costs
	// a pull tens to hundreds of µs on a small VM (a wake and its spin).
	up   atomic.Bool
	maps mapState // segments mapped for shared keys (mapGet)
	// Under b.mu: when the last Close was (expire waits EndpointLinger
	// from it), the one timer that expires the endpoint, and when a Close
	// last had the owner thread sweep the endpoint's caches.
	closedAt time.Time
	expiry   *time.Timer
	swept    time.Time
}

// current returns the live UCP endpoint, creating one if the last was
// closed. Runs on the owner thread.
func (e *endpoint) current() (*uep, error) {
	if e.u != nil && !e.u.closed {
		return e.u, nil
	}
	u, err := e.b.w.connect(e.addr)
	if err != nil {
		return nil, err
	}
	u.maps = &e.maps
	u.up = &e.up
	e.u = u
	e.up.Store(true)
	return u, nil
}

// Endpoint is one caller's reference to a (shared) UCP endpoint.
type Endpoint struct {
	e      *endpoint
	closed atomic.Bool
}

var _ transport.Endpoint = (*Endpoint)(nil)

// Connect returns an endpoint to the backend at addr (another Backend's
// Address). Endpoints to one address share a UCP endpoint and its rkey
// cache; each Endpoint must be closed.
func (b *Backend) Connect(ctx context.Context, addr []byte) (transport.Endpoint, error) {
	ua, err := parseAddr(addr)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, transport.CtxErr(err)
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, transport.ErrClosed
	}
	e := b.eps[string(addr)]
	if e == nil {
		e = &endpoint{b: b, key: string(addr), addr: bytes.Clone(ua)}
		b.eps[e.key] = e
	}
	e.refs++
	up := e.up.Load()
	b.mu.Unlock()
	h := &Endpoint{e: e}
	if up {
		return h, nil // connected already (a lingering endpoint, or another pull's)
	}
	if err2 := b.w.call(func() { _, err = e.current() }); err2 != nil {
		err = err2
	}
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("ucx: connect: %w", err)
	}
	return h, nil
}

// EndpointLinger is how long an endpoint that has read shared memory
// (Allocate'd by its peer) stays open after its last Endpoint closed. Its
// cached rkeys keep the peer's segments mapped here, so the next pull from
// the same holder neither unpacks nor page-faults them again; a Connect to
// the same address within the period reuses it. The cost is that a freed
// allocation of the peer stays mapped here (its memory is not returned to
// the system) until the period ends.
const EndpointLinger = 30 * time.Second

// Close releases this reference. The last one force-closes the UCP
// endpoint, or, if it has read shared memory, keeps it for EndpointLinger
// (dropping its other cached rkeys). Idempotent.
func (h *Endpoint) Close() error {
	if !h.closed.CompareAndSwap(false, true) {
		return nil
	}
	e, b := h.e, h.e.b
	b.mu.Lock()
	e.refs--
	last := e.refs == 0
	mine := b.eps[e.key] == e
	linger := last && mine && !b.closed && e.shared.Load()
	if last && mine && !linger {
		delete(b.eps, e.key)
	}
	now := time.Now()
	sweep := false
	if linger {
		e.closedAt = now
		if e.expiry == nil {
			e.expiry = time.AfterFunc(EndpointLinger, e.expire)
		} else {
			e.expiry.Reset(EndpointLinger)
		}
		if sweep = now.Sub(e.swept) >= sweepEvery; sweep {
			e.swept = now
		}
	}
	b.mu.Unlock()
	switch {
	case linger && sweep:
		// Housekeeping only, so not waited for, and at most every
		// sweepEvery: a pull's Close is on its critical path, and waking
		// the owner thread costs 25–300 µs on the VMs measured here (a
		// wake, then its spin). It rechecks the endpoint when it runs.
		b.w.submit(func() {
			if e.u != nil && !e.u.closed && !b.w.busy(e.u) {
				b.w.dropRkeys(e.u)
				b.w.dropIdleShared(e.u, EndpointLinger)
			}
		})
	case last && !linger:
		b.w.call(func() {
			if e.u != nil {
				b.w.closeEP(e.u, transport.ErrClosed)
			}
		})
	}
	return nil
}

// sweepEvery is how often at most a lingering endpoint's Close has the
// owner thread drop the endpoint's cached rkeys of checked keys and unmap
// the shared segments no copy used for EndpointLinger.
const sweepEvery = time.Second

// expire closes a lingering endpoint unless it was used since: its timer
// fires EndpointLinger after the last Close, or a Close moved it.
func (e *endpoint) expire() {
	b := e.b
	b.mu.Lock()
	if left := EndpointLinger - time.Since(e.closedAt); left > 0 && e.refs == 0 {
		e.expiry.Reset(left) // closed again after the timer fired
		b.mu.Unlock()
		return
	}
	if e.refs != 0 || b.eps[e.key] != e {
		b.mu.Unlock()
		return
	}
	delete(b.eps, e.key)
	b.mu.Unlock()
	b.w.call(func() {
		if e.u != nil {
			b.w.closeEP(e.u, transport.ErrClosed)
		}
	})
}
