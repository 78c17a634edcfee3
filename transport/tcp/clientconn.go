package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/connex/connex/transport"
)

// clientReadBuf is the reader's buffer for response headers. Payloads at
// least this large are read by the kernel straight into GetOp.Dst; only the
// part that arrived together with a header is copied out of this buffer.
const clientReadBuf = 4 << 10

// epoch anchors monoNow; time.Since uses the monotonic clock.
var epoch = time.Now()

// monoNow returns monotonic nanoseconds since process start (always > 0
// after the first few nanoseconds, so 0 can mean "never").
func monoNow() int64 { return int64(time.Since(epoch)) + 1 }

// aLongTimeAgo is a deadline in the past, to unblock a pending write.
var aLongTimeAgo = time.Unix(1, 0)

// pendingReq is one request a Get sent and has not seen completed yet. Its
// completion is sent exactly once on call.done, by the connection's reader.
type pendingReq struct {
	call  *getCall
	chunk int // index into the Get's chunks
	conn  *clientConn
	key   remoteKey
	off   uint64
	dst   []byte
	to    scatter // where the payload lands in dst
	slot  int     // index in the Get's in-flight list
	sent  int64   // monoNow when its frame was written (the Get's goroutine only)

	id        uint64 // guarded by conn.mu once sent
	abandoned bool   // guarded by conn.mu: discard the payload
	err       error  // written by the reader before completion
}

// clientConn is one connection from a reader to a holder. Requests are
// written by the Gets themselves (serialized by wlock); one goroutine reads
// responses and completes them.
type clientConn struct {
	log  *slog.Logger
	addr string
	nc   net.Conn
	cfg  *Config

	wlock chan struct{} // 1-slot semaphore: a ctx-aware write mutex
	wbuf  []byte        // guarded by wlock
	wseq  uint64        // guarded by mu: bumped around every write

	mu        sync.Mutex
	pending   map[uint64]*pendingReq
	nextID    uint64
	current   *pendingReq // response whose payload is being read into dst
	kicked    bool        // a read deadline was set to unblock the reader
	abandoned int         // pending requests whose Get gave up, header unseen
	err       error       // why the connection is failing; nil while usable

	done     chan struct{} // closed when the reader has exited
	lastRecv atomic.Int64  // monoNow of the last read that returned bytes, or of the dial

	ep      *endpoint
	iov     [][]byte      // the reader's: where a payload lands (scatter.iovAt)
	offered uint8         // the protocol version this side's hello offered
	version atomic.Uint32 // the version the holder's hello answered; 0 before it
}

func newClientConn(e *endpoint, nc net.Conn, offered uint8) *clientConn {
	c := &clientConn{
		ep:      e,
		offered: offered,
		log:     e.b.log,
		addr:    e.addr,
		nc:      nc,
		cfg:     &e.b.cfg,
		wlock:   make(chan struct{}, 1),
		pending: make(map[uint64]*pendingReq),
		done:    make(chan struct{}),
	}
	c.lastRecv.Store(monoNow())
	return c
}

// dialConn connects to addr and sends a hello offering version. Requests may
// follow at once; the server's hello is checked by the reader.
func dialConn(ctx context.Context, b *Backend, addr string, version uint8) (net.Conn, error) {
	d := net.Dialer{KeepAlive: 15 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("tcp dial %s: %w", addr, transport.CtxErr(ctx.Err()))
		}
		// The dialer enforces ctx's deadline itself and may notice it a
		// moment before ctx does.
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return nil, fmt.Errorf("tcp dial %s: %w", addr, transport.CtxErr(context.DeadlineExceeded))
		}
		return nil, fmt.Errorf("tcp dial %s: %w: %v", addr, transport.ErrPeerGone, err)
	}
	b.tuneConn(nc)
	if b.cfg.ClientTLS != nil {
		c := b.cfg.ClientTLS.Clone()
		if c.ServerName == "" {
			c.ServerName, _, _ = net.SplitHostPort(addr)
		}
		tc := tls.Client(nc, c)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = nc.Close()
			if ctx.Err() != nil {
				return nil, fmt.Errorf("tcp dial %s: tls handshake: %w", addr, transport.CtxErr(ctx.Err()))
			}
			return nil, fmt.Errorf("tcp dial %s: tls handshake (data-plane certificates: see data_tls): %w: %v", addr, transport.ErrPeerGone, err)
		}
		nc = tc
	}
	var hello [helloLen]byte
	// 8 bytes into a fresh socket's empty send buffer: never blocks.
	_ = nc.SetWriteDeadline(time.Now().Add(b.cfg.WriteTimeout))
	if _, err := nc.Write(appendHello(hello[:0], version)); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("tcp dial %s: hello: %w: %v", addr, transport.ErrPeerGone, err)
	}
	return nc, nil
}

// usable reports whether new requests may be sent on c.
// errIdle is why a reader closes a connection it has not used for
// ClientIdle.
var errIdle = errors.New("tcp: connection idle")

// idle reports whether c has no request in flight and received nothing for
// d (its dial counts as a receive).
func (c *clientConn) idle(d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending) == 0 && monoNow()-c.lastRecv.Load() > int64(d)
}

func (c *clientConn) usable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == nil
}

// abort fails c with reason (unless it already failed) and closes the
// socket; the reader then completes every pending request with the reason.
// It does not wait; <-c.done does.
func (c *clientConn) abort(reason error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = reason
	}
	c.mu.Unlock()
	_ = c.nc.Close()
}

// errConnDead is returned by send when c failed before the requests were
// registered; the caller picks (or dials) another connection.
var errConnDead = errors.New("tcp: connection no longer usable")

// send registers reqs as pending and writes their frames. It returns
// errConnDead if c is failing (nothing was sent), or a context error if ctx
// ended while waiting to write. Once it returns nil every request will be
// completed on its call's channel, even if the write itself fails.
func (c *clientConn) send(ctx context.Context, reqs []*pendingReq) error {
	select {
	case c.wlock <- struct{}{}:
	case <-ctx.Done():
		return transport.CtxErr(ctx.Err())
	}
	defer func() { <-c.wlock }()

	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return errConnDead
	}
	buf := c.wbuf[:0]
	for _, r := range reqs {
		if r.to.parts != nil && c.offered < gatherVersion {
			// Planned against a holder that spoke version 2; this
			// connection's holder refused that offer since.
			r.err = errGatherRefused
			r.call.done <- r // never blocks: sized for the call's window
			continue
		}
		c.nextID++
		r.id = c.nextID
		r.conn = c
		c.pending[r.id] = r
		if r.to.parts != nil {
			buf = appendGather(buf, request{id: r.id, key: r.key, length: uint32(r.to.n), segs: r.to.segments()})
		} else {
			buf = appendRequest(buf, request{id: r.id, key: r.key, offset: r.off, length: uint32(r.to.n)})
		}
	}
	c.wseq++
	seq := c.wseq
	c.mu.Unlock()
	c.wbuf = buf

	// The window keeps request bytes far below the socket buffers, so this
	// write blocks only against a peer that stopped reading; ctx still
	// bounds it. The callback may run late, after stop, so it checks that
	// this write is still the current one before poisoning the deadline.
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
	stop := context.AfterFunc(ctx, func() {
		c.mu.Lock()
		if c.wseq == seq {
			_ = c.nc.SetWriteDeadline(aLongTimeAgo)
		}
		c.mu.Unlock()
	})
	_, err := c.nc.Write(buf)
	stop()
	c.mu.Lock()
	c.wseq++ // disarm a late callback
	c.mu.Unlock()
	if err != nil {
		// A partial frame breaks the stream: the connection is done for.
		if ctx.Err() != nil {
			c.abort(errConnAborted)
		} else {
			c.abort(fmt.Errorf("%w: %s: %w: write: %v", transport.ErrPeerGone, c.addr, errConnLost, err))
		}
	}
	return nil
}

// cancel asks the holder, best effort, not to answer ids (abandoned
// requests it may still have queued). It never waits for another writer,
// and gives up on the connection if the holder has not drained its socket
// for cancelWriteTimeout.
func (c *clientConn) cancel(ids []uint64) {
	select {
	case c.wlock <- struct{}{}:
	default:
		return
	}
	defer func() { <-c.wlock }()
	buf := c.wbuf[:0]
	for _, id := range ids {
		buf = appendCancel(buf, id)
	}
	c.wbuf = buf
	_ = c.nc.SetWriteDeadline(time.Now().Add(cancelWriteTimeout))
	if _, err := c.nc.Write(buf); err != nil {
		c.abort(errConnAborted)
	}
}

// cancelWriteTimeout bounds the write of CANCEL frames; a holder that does
// not take a few hundred bytes in this time is frozen.
const cancelWriteTimeout = 10 * time.Millisecond

// readLoop reads responses until the connection fails, then completes every
// pending request with the reason.
func (c *clientConn) readLoop(wg *sync.WaitGroup) {
	defer wg.Done()
	err := c.read()

	c.mu.Lock()
	if c.err == nil {
		switch {
		case errors.Is(err, errProtocol):
			c.log.Warn("tcp: bad response; closing connection", "peer", c.addr, "err", err)
			c.err = fmt.Errorf("%w: %s: %w", transport.ErrPeerGone, c.addr, err)
		case isClosedErr(err):
			c.log.Debug("tcp: holder closed connection", "peer", c.addr, "err", err)
			c.err = fmt.Errorf("%w: %s: %w: %v", transport.ErrPeerGone, c.addr, errConnLost, err)
			if c.version.Load() == 0 && c.offered > minProtocolVersion {
				c.ep.refused(c.offered)
			}
		default:
			c.log.Warn("tcp: connection to holder failed", "peer", c.addr, "err", err)
			c.err = fmt.Errorf("%w: %s: %w: %v", transport.ErrPeerGone, c.addr, errConnLost, err)
		}
	}
	reason := c.err
	pending := c.pending
	c.pending = nil
	c.current = nil
	c.mu.Unlock()
	_ = c.nc.Close()

	for _, r := range pending {
		r.err = reason
		r.call.done <- r // never blocks: sized for the call's window
	}
	close(c.done)
}

// read decodes the server's hello and then responses, completing requests.
func (c *clientConn) read() error {
	br := newRecvBuf(c, clientReadBuf)
	var hdr [responseLen]byte
	if err := c.readFull(br, hdr[:helloLen]); err != nil {
		return err
	}
	v, err := decodeHello(hdr[:helloLen])
	if err != nil {
		return err
	}
	if v > c.offered {
		return protoErr("holder answered protocol version %d to an offer of %d", v, c.offered)
	}
	c.version.Store(uint32(v))
	c.ep.learned(v, c.offered)
	for {
		if err := c.readFull(br, hdr[:]); err != nil {
			return err
		}
		resp, err := decodeResponse(hdr[:])
		if err != nil {
			return err
		}
		c.mu.Lock()
		r := c.pending[resp.id]
		if r == nil {
			c.mu.Unlock()
			return protoErr("response to unknown request id %d", resp.id)
		}
		if r.abandoned {
			c.abandoned-- // counted by abandon, which saw it before its header
		}
		if err := checkResponse(resp, uint32(r.to.n)); err != nil {
			c.mu.Unlock()
			return err
		}
		if resp.status == statusCanceled && !r.abandoned {
			c.mu.Unlock()
			return protoErr("request %d canceled but never abandoned", resp.id)
		}
		// r stays pending until completed, so the exit path completes it
		// if the connection fails halfway through its payload.
		n := int(resp.length)
		got := 0
		if !r.abandoned && n > 0 {
			c.current = r
			c.mu.Unlock()
			got, err = c.readPayload(br, r)
			if err == errDstFault {
				r.err, err = err, nil
			}
			if err != nil {
				return err
			}
			c.mu.Lock()
			c.current = nil
		}
		// From here on the reader does not touch r.dst.
		delete(c.pending, resp.id)
		c.mu.Unlock()
		switch resp.status {
		case statusNotRegistered:
			r.err = transport.ErrNotRegistered
		case statusFault:
			r.err = errSrcFault
		}
		r.call.done <- r
		// The rest of a payload nobody wants any more.
		if err := c.discard(br, n-got); err != nil {
			return err
		}
	}
}

// A kick is how an abandoning Get stops the reader from writing into its
// Dst without closing the connection: it sets c.kicked and a read deadline
// in the past (both under c.mu). The reader's blocked Read returns at once;
// the reader clears the deadline and carries on, discarding what is left of
// an abandoned payload.

// rideKick reports whether err is the deadline of a kick, and if so clears
// the kick so reading can continue. Call with c.mu held.
func (c *clientConn) rideKick(err error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) || !c.kicked {
		return false
	}
	c.kicked = false
	_ = c.nc.SetReadDeadline(time.Time{})
	return true
}

// rideKicks calls step until it has consumed n bytes in all, riding out
// kicks: step gets the count consumed so far and returns how many more it
// consumed; an error that is not a kick's deadline ends it.
func (c *clientConn) rideKicks(n int, step func(done int) (int, error)) error {
	for done := 0; done < n; {
		m, err := step(done)
		done += m
		if err != nil {
			c.mu.Lock()
			kick := c.rideKick(err)
			c.mu.Unlock()
			if !kick {
				return err
			}
		}
	}
	return nil
}

// readFull is io.ReadFull that rides out kicks.
func (c *clientConn) readFull(br *recvBuf, p []byte) error {
	return c.rideKicks(len(p), func(got int) (int, error) { return br.Read(p[got:]) })
}

// readPayload reads r's payload straight into r.dst (in pieces where r.to
// says so). It returns early, with
// the count read, once r was abandoned and its Get kicked the reader, or
// with errDstFault when r.dst faulted (the rest of the payload is then
// still to be discarded).
func (c *clientConn) readPayload(br *recvBuf, r *pendingReq) (int, error) {
	if r.to.piece != 0 && r.to.parts == nil {
		return c.readScattered(br, r)
	}
	got := 0
	if c.iov == nil {
		c.iov = make([][]byte, 0, maxReadIov)
	}
	for got < r.to.n {
		iov := r.to.iovAt(r.dst, got, c.iov[:0])
		n, err := readCatchingFaults(br, iov)
		clear(iov) // drop references to the caller's memory
		got += n
		if err == nil {
			continue
		}
		if err == errDstFault {
			return got, err
		}
		c.mu.Lock()
		kick := c.rideKick(err)
		stop := r.abandoned
		c.mu.Unlock()
		if !kick {
			return got, err
		}
		if stop {
			return got, nil
		}
	}
	return got, nil
}

// discard skips n payload bytes, riding out kicks.
func (c *clientConn) discard(br *recvBuf, n int) error {
	return c.rideKicks(n, func(done int) (int, error) { return br.Discard(n - done) })
}
