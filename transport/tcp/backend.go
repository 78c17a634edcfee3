package tcp

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/connex/connex/transport"
)

// Backend is the TCP data plane: it serves registered memory on a listening
// socket and reads from other backends through cached Endpoints. All methods
// are safe for concurrent use.
type Backend struct {
	cfg  Config
	log  *slog.Logger
	ln   net.Listener
	addr []byte
	wg   sync.WaitGroup // accept loop, server connections, client readers

	closeOnce sync.Once
	quit      chan struct{} // closed by Close

	regMu sync.RWMutex
	regs  map[uint64]*registration
	regID uint64 // last id handed out; guarded by regMu

	mu      sync.Mutex
	closed  bool
	conns   map[*serverConn]struct{} // every accepted connection, in its handshake or served
	perPeer map[string]int           // served connections per remote IP (MaxConnsPerPeer)
	served  int                      // served connections (MaxConns)
	// pending are the connections still in their handshake (TLS and
	// hello), oldest first, and pendingPerPeer their count per remote IP:
	// capped by the same numbers as served ones, but the oldest gives way
	// to a newcomer, so connections that never finish cannot keep a
	// member's out.
	pending        []*serverConn
	pendingPerPeer map[string]int
	endpoints      map[string]*endpoint

	stats stats
}

var (
	_ transport.Backend  = (*Backend)(nil)
	_ transport.Counters = (*Backend)(nil)
)

// Open starts a TCP backend listening on opts.ListenAddr (empty means
// 127.0.0.1:0) with DefaultConfig.
func Open(opts transport.Options) (*Backend, error) {
	return OpenConfig(opts, Config{})
}

// OpenConfig is Open with TCP-specific tuning; zero fields of cfg take their
// defaults.
func OpenConfig(opts transport.Options, cfg Config) (*Backend, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	addr := opts.ListenAddr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp backend: listen %s: %w", addr, err)
	}
	b := &Backend{
		cfg:            cfg,
		log:            opts.Log().With("backend", "tcp"),
		ln:             ln,
		addr:           []byte(ln.Addr().String()),
		quit:           make(chan struct{}),
		regs:           make(map[uint64]*registration),
		conns:          make(map[*serverConn]struct{}),
		perPeer:        make(map[string]int),
		pendingPerPeer: make(map[string]int),
		endpoints:      make(map[string]*endpoint),
	}
	b.wg.Add(1)
	go b.acceptLoop()
	b.log.Debug("tcp backend listening", "addr", ln.Addr().String())
	return b, nil
}

// Name returns "tcp".
func (b *Backend) Name() string { return "tcp" }

// Caps reports that RegisterExtents gives one key for many extents of any
// memory, that Gets report progress chunk by chunk, that a strided op whose
// pieces lie back to back at the holder is read in requests of many pieces
// (scatter.go), and nothing else: the holder's CPU copies the bytes, it
// allocates no memory, registers and deregisters one buffer at a time, and
// splits Gets of any size itself. Deregister cuts running reads of a key
// (TestCapsMatchBehaviour).
func (b *Backend) Caps() transport.Caps {
	return transport.Caps{
		ExtentKeys:  true,
		Progress:    true,
		Strided:     true,
		Counters:    true,
		MaxGetBytes: 0,
	}
}

// Counters are the TCP data plane's counts for operators (Caps.Counters):
// requests this holder served, by kind, and the holders this reader's
// endpoints fell back to protocol version 1 for.
func (b *Backend) Counters() []transport.Counter {
	return []transport.Counter{
		{Name: "tcp_gets_served", Help: "GET requests this member's TCP data plane answered, any status (one range each).", Value: b.stats.gets.Load},
		{Name: "tcp_gathers_served", Help: "GATHER requests (protocol version 2: up to 64 ranges each) this member's TCP data plane answered, any status.", Value: b.stats.gathers.Load},
		{Name: "tcp_protocol_fallbacks", Help: "Times this member's TCP reader fell back to protocol version 1 for a holder that refused version 2 (an older connexd: reads without GATHER, slower for small pieces).", Value: b.stats.fallbacks.Load},
	}
}

// stats are the counts behind Counters.
type stats struct {
	gets, gathers, fallbacks atomic.Uint64
}

// Address returns the listener's host:port. When the backend listens on an
// unspecified address (":0"), the host part is unspecified too and only
// useful on the same machine.
func (b *Backend) Address() []byte { return append([]byte(nil), b.addr...) }

// Register exposes mem to remote readers. The key's id is unique within this
// Backend and its secret is 8 random bytes; RemoteAddr is 0.
func (b *Backend) Register(mem []byte) (transport.Registration, error) {
	return b.register(mem, nil)
}

// RegisterExtents exposes only the given extents of mem under one key (see
// transport.ExtentRegistrar). Extents must be sorted by Off, disjoint,
// non-empty and inside mem.
func (b *Backend) RegisterExtents(mem []byte, extents []transport.Extent) (transport.Registration, error) {
	if err := transport.ValidateExtents(extents, uint64(len(mem))); err != nil {
		return nil, fmt.Errorf("tcp register: %w", err)
	}
	p := transport.NewPeriodicExtents(transport.JoinAdjacent(extents))
	return b.register(mem, &p)
}

func (b *Backend) register(mem []byte, extents *transport.PeriodicExtents) (transport.Registration, error) {
	r := &registration{b: b, mem: mem, n: uint64(len(mem)), extents: extents}
	if _, err := rand.Read(r.secret[:]); err != nil {
		return nil, fmt.Errorf("tcp register: secret: %w", err)
	}
	// b.mu across the insert: Close either sees this registration (and
	// deregisters it) or this call sees Close.
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("tcp register: %w", transport.ErrClosed)
	}
	b.regMu.Lock()
	b.regID++
	r.id = b.regID
	r.key = encodeKey(remoteKey{id: r.id, secret: r.secret})
	b.regs[r.id] = r
	b.regMu.Unlock()
	return r, nil
}

// lookup returns the live registration with id, or nil.
func (b *Backend) lookup(id uint64) *registration {
	b.regMu.RLock()
	r := b.regs[id]
	b.regMu.RUnlock()
	return r
}

// Connect returns an endpoint to the backend at addr (a host:port from
// Address). Endpoints to one address share their connections; each returned
// Endpoint must be closed once. Connect dials with ctx's deadline.
func (b *Backend) Connect(ctx context.Context, addr []byte) (transport.Endpoint, error) {
	if len(addr) == 0 {
		return nil, fmt.Errorf("tcp connect: empty address: %w", transport.ErrPeerGone)
	}
	key := string(addr)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, fmt.Errorf("tcp connect %s: %w", key, transport.ErrClosed)
	}
	e := b.endpoints[key]
	if e == nil {
		e = newEndpoint(b, key)
		b.endpoints[key] = e
	}
	e.refs++
	b.mu.Unlock()

	if _, err := e.conn(ctx, 0); err != nil {
		b.release(e)
		return nil, err
	}
	// The endpoint's other connections now too, on the connect's clock:
	// dialed lazily by a Get, a lost SYN (a second before Linux sends it
	// again) would spend most of the Get's stall deadline. One that fails
	// here is dialed by the Get that needs it.
	if len(e.slots) > 1 {
		var wg sync.WaitGroup
		for i := 1; i < len(e.slots); i++ {
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = e.conn(ctx, i) }()
		}
		wg.Wait()
	}
	return &endpointRef{e: e, done: make(chan struct{})}, nil
}

// release drops one reference to e. After the last one e lingers for
// ClientIdle with its connections, so that the next pull from the same
// holder (a resume, the next request) need not dial and handshake again:
// that was most of a small pull's read. A Connect within the linger reuses
// it; expire shuts it down after.
func (b *Backend) release(e *endpoint) {
	b.mu.Lock()
	e.refs--
	if e.refs > 0 {
		b.mu.Unlock()
		return
	}
	if b.endpoints[e.addr] == e && !b.closed {
		e.releasedAt = time.Now()
		if e.linger == nil {
			e.linger = time.AfterFunc(b.cfg.ClientIdle, func() { b.expire(e) })
		} else {
			e.linger.Reset(b.cfg.ClientIdle)
		}
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	e.shutdown(fmt.Errorf("tcp endpoint %s: %w", e.addr, transport.ErrClosed))
}

// expire shuts a lingering endpoint down unless it was used since: its
// timer fires ClientIdle after the last release, or a release moved it.
func (b *Backend) expire(e *endpoint) {
	b.mu.Lock()
	if e.refs != 0 || b.endpoints[e.addr] != e {
		b.mu.Unlock()
		return
	}
	if left := b.cfg.ClientIdle - time.Since(e.releasedAt); left > 0 {
		e.linger.Reset(left) // released again after the timer fired
		b.mu.Unlock()
		return
	}
	delete(b.endpoints, e.addr)
	b.mu.Unlock()
	e.shutdown(fmt.Errorf("tcp endpoint %s: %w", e.addr, transport.ErrClosed))
}

// Close stops the listener, closes every connection (in-flight Gets fail
// with ErrClosed), deregisters all memory and waits for the backend's
// goroutines. It is idempotent.
func (b *Backend) Close() error {
	b.closeOnce.Do(b.close)
	return nil
}

func (b *Backend) close() {
	b.mu.Lock()
	b.closed = true
	conns := make([]*serverConn, 0, len(b.conns))
	for sc := range b.conns {
		conns = append(conns, sc)
	}
	eps := make([]*endpoint, 0, len(b.endpoints))
	for _, e := range b.endpoints {
		eps = append(eps, e)
	}
	clear(b.endpoints)
	b.mu.Unlock()

	close(b.quit)
	_ = b.ln.Close()
	// Closing server connections first unblocks their writes, so the
	// deregistrations below never wait on a slow reader.
	for _, sc := range conns {
		_ = sc.raw.Close() // not nc: run may be wrapping it in TLS
	}
	for _, e := range eps {
		e.shutdown(fmt.Errorf("tcp endpoint %s: %w", e.addr, transport.ErrClosed))
	}
	b.regMu.RLock()
	regs := make([]*registration, 0, len(b.regs))
	for _, r := range b.regs {
		regs = append(regs, r)
	}
	b.regMu.RUnlock()
	for _, r := range regs {
		_ = r.Deregister()
	}

	done := make(chan struct{})
	go func() { b.wg.Wait(); close(done) }()
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		// Every goroutine exits once its socket is closed, so this is a bug;
		// memory safety does not depend on it (all registrations are
		// deregistered above).
		b.log.Warn("tcp backend: goroutines still running 10s after close")
	}
	b.log.Debug("tcp backend closed", "addr", string(b.addr))
}

// isClosed reports whether Close has started.
func (b *Backend) isClosed() bool {
	select {
	case <-b.quit:
		return true
	default:
		return false
	}
}

// tuneConn applies socket options shared by both directions.
func (b *Backend) tuneConn(nc net.Conn) {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return
	}
	_ = tc.SetNoDelay(true)
	if n := b.cfg.SocketBuffer; n > 0 {
		_ = tc.SetReadBuffer(n)
		_ = tc.SetWriteBuffer(n)
	}
}

// isClosedErr reports errors that mean "we or the peer closed the socket",
// which are expected and logged at Debug.
func isClosedErr(err error) bool {
	return errors.Is(err, net.ErrClosed) || isEOF(err) || isReset(err)
}
