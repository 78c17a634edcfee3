package tcp

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/connex/connex/transport"
)

// endpoint is the shared state of every Endpoint to one address: a few
// connections, redialed on demand after a failure.
type endpoint struct {
	b    *Backend
	addr string
	refs int // guarded by b.mu
	// Guarded by b.mu: when the last reference went (the endpoint lingers
	// from then, Backend.release) and the timer that expires it.
	releasedAt time.Time
	linger     *time.Timer

	mu    sync.Mutex
	slots []*clientConn
	err   error // set by shutdown; no more dials

	rr atomic.Uint32 // spreads Gets' first chunks over the slots

	// proto is the protocol version the holder speaks, as the last hello
	// answering a higher offer said (or 1 once it refused such offers);
	// 0 until one is known. closes counts connections closed before their
	// hello since the last hello; downgraded is when proto last became 1
	// that way (monoNow).
	proto      atomic.Uint32
	closes     atomic.Int32
	downgraded atomic.Int64
}

// reofferAfter is how long an endpoint whose holder refused version 2
// offers 1 before it offers 2 again (the address may be served by a newer
// connexd since).
const reofferAfter = 5 * time.Minute

// offer is the protocol version a new connection's hello offers: the
// highest, unless the holder refused it in the last reofferAfter.
func (e *endpoint) offer() uint8 {
	if e.proto.Load() == minProtocolVersion && time.Duration(monoNow()-e.downgraded.Load()) < reofferAfter {
		return minProtocolVersion
	}
	return ProtocolVersion
}

// learned records the version a holder's hello answered to an offer of
// offered (an answer to an offer of 1 says nothing of the holder).
func (e *endpoint) learned(v, offered uint8) {
	e.closes.Store(0)
	if offered > minProtocolVersion {
		e.proto.Store(uint32(v))
	}
}

// refused records that the holder closed a connection whose hello offered
// version v before answering it. That is a holder older than v — or one
// that shed the connection (full, restarting): so it counts as a refusal
// only while nothing says the holder speaks v (no hello yet), or for a
// second close in a row. Later connections then offer version 1.
func (e *endpoint) refused(v uint8) {
	if e.closes.Add(1) < 2 && e.proto.Load() >= uint32(v) {
		return
	}
	e.downgraded.Store(monoNow())
	if e.proto.Swap(minProtocolVersion) != minProtocolVersion {
		e.b.stats.fallbacks.Add(1)
		e.b.log.Info("tcp: the holder closed connections offering protocol version "+strconv.Itoa(int(v))+" before its hello; offering version 1 (an older connexd?)", "peer", e.addr)
	}
}

// gathers reports whether Gets may send GATHER requests: the holder spoke
// version 2 or later.
func (e *endpoint) gathers() bool { return e.proto.Load() >= gatherVersion }

func newEndpoint(b *Backend, addr string) *endpoint {
	return &endpoint{b: b, addr: addr, slots: make([]*clientConn, b.cfg.ConnsPerEndpoint)}
}

// conn returns a usable connection for slot i, dialing one (with ctx's
// deadline) if the slot is empty or its connection failed.
func (e *endpoint) conn(ctx context.Context, i int) (*clientConn, error) {
	e.mu.Lock()
	if e.err != nil {
		e.mu.Unlock()
		return nil, e.err
	}
	if c := e.slots[i]; c != nil && c.usable() {
		if !c.idle(e.b.cfg.ClientIdle) {
			e.mu.Unlock()
			return c, nil
		}
		// Unused for ClientIdle: close it before the holder's IdleTimeout
		// would, so no request is ever sent on a connection being closed.
		c.abort(errIdle)
		e.slots[i] = nil
	}
	e.mu.Unlock()

	offered := e.offer()
	nc, err := dialConn(ctx, e.b, e.addr, offered)
	if err != nil {
		return nil, err
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err != nil {
		_ = nc.Close()
		return nil, e.err
	}
	if c := e.slots[i]; c != nil && c.usable() {
		_ = nc.Close() // a concurrent Get redialed first
		return c, nil
	}
	c := newClientConn(e, nc, offered)
	e.slots[i] = c
	// Add happens under e.mu before shutdown (which Backend.Close runs
	// before waiting) can see e.err == nil, so Close waits for this reader.
	e.b.wg.Add(1)
	go c.readLoop(&e.b.wg)
	e.b.log.Debug("tcp: connected to holder", "peer", e.addr, "slot", i)
	return c, nil
}

// shutdown fails every connection with reason and waits for their readers.
func (e *endpoint) shutdown(reason error) {
	e.mu.Lock()
	if e.err == nil {
		e.err = reason
	}
	conns := make([]*clientConn, 0, len(e.slots))
	for _, c := range e.slots {
		if c != nil {
			conns = append(conns, c)
		}
	}
	e.mu.Unlock()
	for _, c := range conns {
		c.abort(reason)
	}
	for _, c := range conns {
		<-c.done
	}
}

// endpointRef is one caller's reference to a shared endpoint.
type endpointRef struct {
	e    *endpoint
	once sync.Once
	done chan struct{} // closed by Close: fails this caller's Gets
}

var _ transport.Endpoint = (*endpointRef)(nil)

// Get reads every op; see transport.Endpoint. Ops may name different
// registrations of the same holder and are split into Config.ChunkBytes
// requests.
func (r *endpointRef) Get(ctx context.Context, ops []transport.GetOp) error {
	return r.GetProgress(ctx, ops, nil)
}

// GetProgress is Get, calling progress (when not nil) with the length of
// each request as it completes (Caps.Progress), and with 0 while bytes
// arrive toward one; see transport.Endpoint.
func (r *endpointRef) GetProgress(ctx context.Context, ops []transport.GetOp, progress func(n int)) error {
	if err := r.closedErr(); err != nil {
		return err
	}
	return r.e.get(ctx, r.done, ops, progress)
}

// closedErr is ErrClosed once this reference is closed, else nil.
func (r *endpointRef) closedErr() error {
	select {
	case <-r.done:
		return fmt.Errorf("tcp get %s: %w", r.e.addr, transport.ErrClosed)
	default:
		return nil
	}
}

// GetStrided reads strided ops (Caps.Strided): an op whose pieces lie back
// to back at the holder in one request per ChunkBytes, scattered into its
// destination as it arrives; any other op a request per piece.
func (r *endpointRef) GetStrided(ctx context.Context, ops []transport.StridedOp) error {
	return r.GetStridedProgress(ctx, ops, nil)
}

// GetStridedProgress is GetStrided reporting each request's bytes as they
// land (Caps.Progress).
func (r *endpointRef) GetStridedProgress(ctx context.Context, ops []transport.StridedOp, progress func(n int)) error {
	if err := r.closedErr(); err != nil {
		return err
	}
	return r.e.getStrided(ctx, r.done, ops, progress)
}

// Close releases this reference; the connections close with the last one.
// Gets still running on this reference fail with ErrClosed. Idempotent.
func (r *endpointRef) Close() error {
	r.once.Do(func() {
		close(r.done)
		r.e.b.release(r.e)
	})
	return nil
}
