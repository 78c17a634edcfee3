package tcp

import (
	"bufio"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Server limits: requests already queued are answered with one writev of at
// most maxBatchOps responses / maxBatchBytes payload (a single larger
// response is sent alone); at most maxQueued requests are read ahead, which
// is what a CANCEL can still reach and bounds the memory a reader can make
// the server hold.
const (
	maxBatchOps   = 64
	maxBatchIov   = 4 * maxBatchOps // GATHERs add an iovec per segment
	maxBatchBytes = 1 << 20
	maxQueued     = 256
	serverReadBuf = 16 << 10 // request frames only: 400 GETs, 15 of the largest GATHERs
)

// serverConn is one accepted reader connection. One goroutine reads its
// requests ahead (readRequests), the connection's own goroutine answers them
// in order (answer).
type serverConn struct {
	b      *Backend
	nc     net.Conn
	raw    net.Conn  // the accepted socket, never replaced (nc becomes its TLS wrapper): what eviction closes
	peerIP string    // counted in Backend.pendingPerPeer, then perPeer
	stage  connStage // guarded by Backend.mu

	queue  chan request  // read ahead, not answered yet
	stop   chan struct{} // closed when answer returns
	qmu    sync.Mutex
	queued map[uint64]bool // ids in queue (or being answered) -> canceled

	// writing is the registration whose lock this connection holds while a
	// batch is being written; Deregister uses it to cut stalled readers.
	writing atomic.Pointer[registration]

	version uint8 // the protocol version the connection speaks (its hello)

	locked *registration // read-locked by the pending batch, or nil
	iov    [][]byte      // pending batch: headers and payload slices
	hdrs   []byte        // backing store for the batch's headers
	nOps   int
	nBytes int
}

// connStage is where a served connection is counted.
type connStage int

const (
	stagePending connStage = iota // in its handshake: Backend.pending
	stageServed                   // handshake done: Backend.served, perPeer
	stageGone                     // counted nowhere (evicted or refused)
)

// admitPending counts a new connection as pending, first closing the
// oldest pending connection of its peer, and then the oldest of all, while
// those are at their caps. Called with b.mu held.
func (b *Backend) admitPending(sc *serverConn) {
	for b.pendingPerPeer[sc.peerIP] >= b.cfg.MaxConnsPerPeer && b.evictPending(sc.peerIP) {
	}
	for len(b.pending) >= b.cfg.MaxConns && b.evictPending("") {
	}
	sc.stage = stagePending
	b.pending = append(b.pending, sc)
	b.pendingPerPeer[sc.peerIP]++
}

// evictPending closes the oldest pending connection (of peer ip, or of
// anyone when ip is ""); false if there is none. Called with b.mu held.
func (b *Backend) evictPending(ip string) bool {
	for _, sc := range b.pending {
		if ip == "" || sc.peerIP == ip {
			b.dropPending(sc)
			sc.stage = stageGone
			_ = sc.raw.Close() // its handshake read fails; run cleans up
			return true
		}
	}
	return false
}

// dropPending removes sc from the pending counts. Called with b.mu held.
func (b *Backend) dropPending(sc *serverConn) {
	if i := slices.Index(b.pending, sc); i >= 0 {
		b.pending = slices.Delete(b.pending, i, i+1)
	}
	if b.pendingPerPeer[sc.peerIP]--; b.pendingPerPeer[sc.peerIP] <= 0 {
		delete(b.pendingPerPeer, sc.peerIP)
	}
}

// serveConn moves sc from pending to served once its handshake is done (TLS,
// when on, proved a member's certificate), or refuses it: evicted while it
// shook hands, or over MaxConns or MaxConnsPerPeer.
func (b *Backend) serveConn(sc *serverConn) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sc.stage != stagePending {
		return errEvicted
	}
	b.dropPending(sc)
	if b.served >= b.cfg.MaxConns || b.perPeer[sc.peerIP] >= b.cfg.MaxConnsPerPeer {
		sc.stage = stageGone
		if b.served >= b.cfg.MaxConns {
			return fmt.Errorf("%w: %d connections served (max)", errFull, b.served)
		}
		return fmt.Errorf("%w: %d connections from %s (max per peer)", errFull, b.perPeer[sc.peerIP], sc.peerIP)
	}
	sc.stage = stageServed
	b.served++
	b.perPeer[sc.peerIP]++
	return nil
}

// errEvicted and errFull end a connection that finished its handshake
// without a slot to serve it in.
var (
	errEvicted = errors.New("tcp: closed during its handshake to make room for newer connections")
	errFull    = errors.New("tcp: too many connections")
)

func (b *Backend) acceptLoop() {
	defer b.wg.Done()
	backoff := time.Duration(0)
	for {
		nc, err := b.ln.Accept()
		if err != nil {
			if b.isClosed() {
				return
			}
			// Out of file descriptors and similar: back off like net/http.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			b.log.Warn("tcp accept failed; retrying", "err", err, "backoff", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-b.quit:
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		// A connection takes a served slot only after its handshake (TLS
		// and hello): until then it is pending, and the oldest pending
		// connection makes room for a new one, so strangers who connect
		// and never finish cannot fill the slots members need.
		sc := &serverConn{b: b, nc: nc, raw: nc, peerIP: remoteIP(nc)}
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			_ = nc.Close()
			continue
		}
		b.admitPending(sc)
		b.conns[sc] = struct{}{}
		b.wg.Add(1)
		b.mu.Unlock()
		go sc.run()
	}
}

func (sc *serverConn) run() {
	b := sc.b
	defer b.wg.Done()
	defer func() {
		b.mu.Lock()
		delete(b.conns, sc)
		switch sc.stage {
		case stagePending:
			b.dropPending(sc)
		case stageServed:
			b.served--
			if b.perPeer[sc.peerIP]--; b.perPeer[sc.peerIP] <= 0 {
				delete(b.perPeer, sc.peerIP)
			}
		}
		sc.stage = stageGone
		b.mu.Unlock()
	}()
	b.tuneConn(sc.nc)
	if b.cfg.ServerTLS != nil {
		sc.nc = tls.Server(sc.nc, b.cfg.ServerTLS)
	}
	peer := sc.nc.RemoteAddr().String()
	b.log.Debug("tcp: reader connected", "peer", peer)
	err := sc.serve()
	_ = sc.nc.Close()
	switch {
	case errors.Is(err, errFull):
		b.log.Warn("tcp: refusing a connection", "peer", peer, "err", err)
	case sc.handshaking():
		// A stranger (no member certificate, a bad hello), a silent
		// connection or one evicted for a newer: debug only, or a flood of
		// them floods the log.
		b.log.Debug("tcp: connection closed in its handshake", "peer", peer, "err", err)
	case errors.Is(err, errProtocol):
		b.log.Warn("tcp: closing connection after bad input", "peer", peer, "err", err)
	case err == nil || isClosedErr(err) || b.isClosed():
		b.log.Debug("tcp: reader disconnected", "peer", peer, "err", err)
	default:
		b.log.Warn("tcp: reader connection failed", "peer", peer, "err", err)
	}
}

// handshaking reports whether sc ended before it was served.
func (sc *serverConn) handshaking() bool {
	sc.b.mu.Lock()
	defer sc.b.mu.Unlock()
	return sc.stage != stageServed
}

// serve runs the handshake and then answers requests until the connection
// fails. It returns nil on a clean EOF between frames.
func (sc *serverConn) serve() error {
	defer sc.release()
	b := sc.b
	var hello [helloLen]byte
	_ = sc.nc.SetReadDeadline(time.Now().Add(b.cfg.HandshakeTimeout))
	if _, err := io.ReadFull(sc.nc, hello[:]); err != nil {
		return err
	}
	v, err := decodeHello(hello[:])
	if err != nil {
		return err
	}
	sc.version = min(v, ProtocolVersion) // the lower of the reader's offer and this side's
	if err := b.serveConn(sc); err != nil {
		return err
	}
	_ = sc.nc.SetReadDeadline(time.Time{})
	_ = sc.nc.SetWriteDeadline(time.Now().Add(b.cfg.WriteTimeout))
	if _, err := sc.nc.Write(appendHello(hello[:0], sc.version)); err != nil {
		return err
	}

	sc.iov = make([][]byte, 0, maxBatchIov+1+MaxGatherSegments)
	sc.hdrs = make([]byte, maxBatchOps*responseLen)
	sc.queue = make(chan request, maxQueued)
	sc.qmu.Lock()
	sc.queued = make(map[uint64]bool, maxQueued)
	sc.qmu.Unlock()
	sc.stop = make(chan struct{})
	readDone := make(chan error, 1)
	go func() { readDone <- sc.readRequests() }()

	err = sc.answer()
	close(sc.stop)
	if err != nil {
		_ = sc.nc.Close() // unblocks readRequests
	}
	rerr := <-readDone
	if err == nil && !errors.Is(rerr, io.EOF) {
		err = rerr
	}
	return err
}

// readRequests decodes frames into sc.queue until the connection fails or
// answer stops; it closes the queue when it returns. CANCELs mark queued
// requests, which are then answered without a payload.
func (sc *serverConn) readRequests() error {
	defer close(sc.queue)
	br := bufio.NewReaderSize(sc.nc, serverReadBuf)
	// A reader that sends nothing for IdleTimeout is dropped (its
	// connection would hold a slot for ever); readers close their own idle
	// connections earlier (ClientIdle). The deadline is renewed before
	// every read of the socket: whenever less than the frame being read is
	// buffered.
	wait := func(n int) {
		if br.Buffered() < n {
			_ = sc.nc.SetReadDeadline(time.Now().Add(sc.b.cfg.IdleTimeout))
		}
	}
	for {
		req, err := readRequest(br, wait)
		if err != nil {
			if isTimeout(err) {
				sc.b.log.Debug("tcp: closing an idle connection", "peer", sc.nc.RemoteAddr().String(), "idle", sc.b.cfg.IdleTimeout)
				return io.EOF
			}
			return err
		}
		if req.op == opGather && sc.version < gatherVersion {
			return protoErr("gather on a connection of protocol version %d", sc.version)
		}
		sc.qmu.Lock()
		_, isQueued := sc.queued[req.id]
		switch {
		case req.op == opCancel:
			if isQueued {
				sc.queued[req.id] = true
			}
			sc.qmu.Unlock()
			continue
		case isQueued:
			sc.qmu.Unlock()
			return protoErr("request id %d reused while outstanding", req.id)
		}
		sc.queued[req.id] = false
		sc.qmu.Unlock()
		select {
		case sc.queue <- req:
		case <-sc.stop:
			return nil
		}
	}
}

// answer serves queued requests in order, batching those already queued
// into one writev. It returns nil once the queue is closed and drained.
func (sc *serverConn) answer() error {
	for {
		req, ok := <-sc.queue
		if !ok {
			return nil
		}
		if err := sc.add(req); err != nil {
			return err
		}
	batch:
		for sc.nOps < maxBatchOps && sc.nBytes < maxBatchBytes && len(sc.iov) < maxBatchIov {
			select {
			case req, ok := <-sc.queue:
				if !ok {
					break batch
				}
				if err := sc.add(req); err != nil {
					return err
				}
			default:
				break batch
			}
		}
		if err := sc.flush(); err != nil {
			return err
		}
	}
}

// remoteIP is the address part of nc's peer (the unit of MaxConnsPerPeer).
func remoteIP(nc net.Conn) string {
	addr := nc.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// isTimeout reports whether err is a passed read deadline.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// readRequest reads and decodes one request frame from br, calling wait
// with the frame's bytes before each read of them (which may block).
func readRequest(br *bufio.Reader, wait func(n int)) (request, error) {
	wait(requestLen)
	p, err := br.Peek(requestLen)
	if err != nil {
		if errors.Is(err, io.EOF) && len(p) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return request{}, err
	}
	req, err := decodeRequest(p)
	if err != nil {
		return request{}, err
	}
	if req.op != opGather {
		_, _ = br.Discard(requestLen)
		return req, nil
	}
	// The segments follow the header; at most MaxGatherSegments of them
	// (decodeRequest), well inside the read buffer.
	n := requestLen + gatherSegments(p)*segmentLen
	wait(n)
	if p, err = br.Peek(n); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return request{}, err
	}
	if err := decodeSegments(&req, p[requestLen:]); err != nil {
		return request{}, err
	}
	_, _ = br.Discard(n)
	return req, nil
}

// add appends the answer to req to the pending batch. It takes the read lock
// of req's registration, flushing first if the batch holds another one.
func (sc *serverConn) add(req request) error {
	if req.op == opGather {
		sc.b.stats.gathers.Add(1)
	} else {
		sc.b.stats.gets.Add(1)
	}
	sc.qmu.Lock()
	canceled := sc.queued[req.id]
	delete(sc.queued, req.id)
	sc.qmu.Unlock()
	if canceled {
		hdr := sc.hdrs[sc.nOps*responseLen : (sc.nOps+1)*responseLen]
		sc.nOps++
		putResponse(hdr, response{id: req.id, status: statusCanceled})
		sc.iov = append(sc.iov, hdr)
		return nil
	}
	r := sc.b.lookup(req.key.id)
	ok := r != nil &&
		subtle.ConstantTimeCompare(r.secret[:], req.key.secret[:]) == 1 &&
		req.allowedBy(r)
	if ok && sc.locked == r && r.dead.Load() {
		ok = false // Deregister is waiting for this batch; serve no more from it
	}
	if ok && sc.locked != r {
		if sc.locked != nil {
			if err := sc.flush(); err != nil {
				return err
			}
		}
		r.mu.RLock()
		if r.dead.Load() {
			r.mu.RUnlock()
			ok = false
		} else {
			sc.locked = r
			sc.writing.Store(r)
		}
	}
	hdr := sc.hdrs[sc.nOps*responseLen : (sc.nOps+1)*responseLen]
	sc.nOps++
	if !ok {
		putResponse(hdr, response{id: req.id, status: statusNotRegistered})
		sc.iov = append(sc.iov, hdr)
		return nil
	}
	segs := req.segs
	if segs == nil {
		segs = []segment{{offset: req.offset, length: req.length}}
	}
	for _, g := range segs {
		if g.length > 0 && !touchPages(r.mem[g.offset:g.offset+uint64(g.length)]) {
			sc.b.log.Warn("tcp data plane: a GET's source faulted: the region file behind it shrank (its engine truncated it?)",
				"registration", req.key.id, "offset", g.offset, "bytes", g.length)
			putResponse(hdr, response{id: req.id, status: statusFault})
			sc.iov = append(sc.iov, hdr)
			return nil
		}
	}
	putResponse(hdr, response{id: req.id, status: statusOK, length: req.length})
	sc.iov = append(sc.iov, hdr)
	for _, g := range segs {
		if g.length > 0 {
			sc.iov = append(sc.iov, r.mem[g.offset:g.offset+uint64(g.length)])
		}
	}
	sc.nBytes += int(req.length)
	return nil
}

// allowedBy reports whether every byte req reads lies in r.
func (req *request) allowedBy(r *registration) bool {
	if req.segs == nil {
		return r.allows(req.offset, uint64(req.length))
	}
	for _, g := range req.segs {
		if !r.allows(g.offset, uint64(g.length)) {
			return false
		}
	}
	return true
}

// flush writes the pending batch straight from registered memory and then
// releases the registration's lock.
func (sc *serverConn) flush() error {
	if sc.nOps == 0 {
		return nil
	}
	_ = sc.nc.SetWriteDeadline(time.Now().Add(sc.b.cfg.WriteTimeout))
	bufs := net.Buffers(sc.iov)
	_, err := bufs.WriteTo(sc.nc)
	sc.release()
	return err
}

// release forgets the pending batch and unlocks its registration.
func (sc *serverConn) release() {
	clear(sc.iov) // drop references to registered memory
	sc.iov = sc.iov[:0]
	sc.nOps, sc.nBytes = 0, 0
	if sc.locked != nil {
		sc.writing.Store(nil)
		sc.locked.mu.RUnlock()
		sc.locked = nil
	}
}
