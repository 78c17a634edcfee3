package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// silentPeer is a TCP listener that accepts connections and reads them but
// never answers: a holder whose process is frozen.
type silentPeer struct {
	ln   net.Listener
	got  atomic.Int64 // bytes received on all connections
	mu   sync.Mutex
	cons []net.Conn
	wg   sync.WaitGroup
}

func newSilentPeer(t *testing.T) *silentPeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &silentPeer{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.cons = append(p.cons, c)
			p.mu.Unlock()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					p.got.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.cons {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *silentPeer) addr() []byte { return []byte(p.ln.Addr().String()) }

// anyKey is a well-formed key for peers that never look at it.
var anyKey = encodeKey(remoteKey{id: 1})

// waitReceived polls until the silent peer has received at least n bytes.
func (p *silentPeer) waitReceived(t *testing.T, n int64) {
	t.Helper()
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if got := p.got.Load(); got < n {
			return fmt.Errorf("peer received %d bytes, want %d", got, n)
		}
		return nil
	})
}

// TestFrozenPeerTimeout: a peer that accepts but never answers makes Get
// return ErrTimeout at its deadline, and ErrCanceled right after a cancel.
func TestFrozenPeerTimeout(t *testing.T) {
	checkNoLeaks(t)
	peer := newSilentPeer(t)
	client := openBackend(t, Config{})
	ctx := context.Background()
	ep, err := client.Connect(ctx, peer.addr())
	if err != nil {
		t.Fatalf("connect to a frozen peer must succeed (the kernel accepts): %v", err)
	}
	defer ep.Close()
	op := []transport.GetOp{{RemoteKey: anyKey, Dst: make([]byte, 1<<20)}}

	for _, deadline := range []time.Duration{200 * time.Millisecond, 50 * time.Millisecond} {
		tctx, cancel := context.WithTimeout(ctx, deadline)
		start := time.Now()
		err = ep.Get(tctx, op)
		elapsed := time.Since(start)
		cancel()
		wantErr(t, err, transport.ErrTimeout)
		if elapsed > deadline+500*time.Millisecond {
			t.Fatalf("Get returned %v after a %v deadline", elapsed, deadline)
		}
		t.Logf("deadline %v: returned after %v", deadline, elapsed)
	}

	cctx, cancel := context.WithCancel(ctx)
	before := peer.got.Load()
	var canceledAt atomic.Int64
	go func() {
		// Not checkFor: t.Fatal must not run off the test goroutine.
		for deadline := time.Now().Add(5 * time.Second); peer.got.Load() < before+requestLen && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		canceledAt.Store(monoNow())
		cancel()
	}()
	err = ep.Get(cctx, op)
	lag := time.Duration(monoNow() - canceledAt.Load())
	wantErr(t, err, transport.ErrCanceled)
	if lag > 500*time.Millisecond {
		t.Fatalf("Get returned %v after cancel", lag)
	}
}

// TestCloseFailsInFlight: closing the Endpoint or the Backend fails a Get
// blocked on a frozen peer with ErrClosed, and Close is idempotent.
func TestCloseFailsInFlight(t *testing.T) {
	checkNoLeaks(t)
	peer := newSilentPeer(t)
	client := openBackend(t, Config{})
	op := []transport.GetOp{{RemoteKey: anyKey, Dst: make([]byte, 1<<20)}}

	for _, closeWhat := range []string{"endpoint", "backend"} {
		ep, err := client.Connect(context.Background(), peer.addr())
		if err != nil {
			t.Fatal(err)
		}
		before := peer.got.Load()
		errc := make(chan error, 1)
		go func() { errc <- ep.Get(context.Background(), op) }()
		peer.waitReceived(t, before+requestLen)
		if closeWhat == "endpoint" {
			_ = ep.Close()
		} else {
			_ = client.Close()
			_ = client.Close()
		}
		select {
		case err := <-errc:
			wantErr(t, err, transport.ErrClosed)
		case <-time.After(5 * time.Second):
			t.Fatalf("Get still blocked 5s after closing the %s", closeWhat)
		}
		_ = ep.Close()
	}
	if _, err := client.Connect(context.Background(), peer.addr()); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("connect after close: %v", err)
	}
	if _, err := client.Register(make([]byte, 1)); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("register after close: %v", err)
	}
}

// TestPeerGone closes the holder's Backend while a large Get is streaming:
// the Get fails with ErrPeerGone, and so do Connect and Get afterwards.
func TestPeerGone(t *testing.T) {
	checkNoLeaks(t)
	client := openBackend(t, Config{})
	mem := randomBytes(13, 24<<20)
	dst := make([]byte, len(mem))
	interrupted := false
	for attempt := 0; attempt < 20 && !interrupted; attempt++ {
		server := openBackend(t, Config{})
		reg := register(t, server, mem)
		ep := connect(t, client, server)
		errc := make(chan error, 1)
		go func() {
			errc <- ep.Get(context.Background(), []transport.GetOp{{RemoteKey: reg.RemoteKey(), Dst: dst}})
		}()
		var err error
		done := false
		checkFor(t, 10*time.Second, 50*time.Microsecond, func() error {
			select {
			case err = <-errc:
				done = true
				return nil
			default:
			}
			if serverWriting(server, reg) {
				return nil
			}
			return errors.New("transfer not started")
		})
		_ = server.Close()
		if !done {
			err = <-errc
		}
		switch {
		case err == nil:
			continue // finished before the close; try again
		case errors.Is(err, transport.ErrPeerGone):
			interrupted = true
		default:
			t.Fatalf("get interrupted by the holder closing: %v, want ErrPeerGone", err)
		}
		err = ep.Get(context.Background(), []transport.GetOp{{RemoteKey: reg.RemoteKey(), Dst: dst[:10]}})
		wantErr(t, err, transport.ErrPeerGone)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = client.Connect(ctx, server.Address())
		cancel()
		wantErr(t, err, transport.ErrPeerGone)
	}
	if !interrupted {
		t.Fatalf("no attempt closed the holder mid-transfer")
	}
}

// TestReconnect drops the holder's side of every connection between Gets:
// the next Get works at once (requests lost with a connection are resent on
// a fresh one).
func TestReconnect(t *testing.T) {
	checkNoLeaks(t)
	server := openBackend(t, Config{})
	client := openBackend(t, Config{ChunkBytes: 256 << 10})
	mem := randomBytes(17, 1<<20)
	reg := register(t, server, mem)
	ep := connect(t, client, server)
	ctx := context.Background()
	for round := range 5 {
		dst := make([]byte, len(mem))
		if err := ep.Get(ctx, []transport.GetOp{{RemoteKey: reg.RemoteKey(), Dst: dst}}); err != nil {
			t.Fatalf("round %d: get: %v", round, err)
		}
		if !bytes.Equal(dst, mem) {
			t.Fatalf("round %d: payload differs", round)
		}
		server.mu.Lock()
		for sc := range server.conns {
			_ = sc.nc.Close()
		}
		server.mu.Unlock()
	}
}

// rawClient speaks the wire protocol by hand so a test can stop reading.
type rawClient struct {
	t  *testing.T
	nc net.Conn
}

func dialRaw(t *testing.T, b *Backend) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", string(b.Address()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	if _, err := nc.Write(appendHello(nil)); err != nil {
		t.Fatal(err)
	}
	var hello [helloLen]byte
	if _, err := io.ReadFull(nc, hello[:]); err != nil {
		t.Fatal(err)
	}
	if err := decodeHello(hello[:]); err != nil {
		t.Fatal(err)
	}
	return &rawClient{t: t, nc: nc}
}

func (c *rawClient) get(id uint64, key []byte, off uint64, n uint32) {
	k, err := decodeKey(key)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.nc.Write(appendRequest(nil, request{id: id, key: k, offset: off, length: n})); err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawClient) response() (response, []byte, error) {
	var hdr [responseLen]byte
	if _, err := io.ReadFull(c.nc, hdr[:]); err != nil {
		return response{}, nil, err
	}
	r, err := decodeResponse(hdr[:])
	if err != nil {
		return r, nil, err
	}
	payload := make([]byte, r.length)
	_, err = io.ReadFull(c.nc, payload)
	return r, payload, err
}

// TestDeregisterWaitsForWrite: Deregister does not return while the server is
// writing from the memory, returns as soon as the write completes, and the
// requests queued behind it are refused.
func TestDeregisterWaitsForWrite(t *testing.T) {
	checkNoLeaks(t)
	server := openBackend(t, Config{DeregisterGrace: time.Minute})
	mem := randomBytes(19, MaxRequestBytes+8192)
	reg, err := server.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, server)
	// 16 MiB does not fit in the socket buffers (net.core.wmem_max plus
	// the untouched receive buffer); two small requests queue behind it.
	c.get(1, reg.RemoteKey(), 0, MaxRequestBytes)
	c.get(2, reg.RemoteKey(), MaxRequestBytes, 4096)
	c.get(3, reg.RemoteKey(), 100, 4096)
	// Nobody reads, so the first 16 MiB answer cannot leave the socket.
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if !serverWriting(server, reg) {
			return errors.New("server not writing yet")
		}
		return nil
	})
	deregistered := make(chan struct{})
	go func() { _ = reg.Deregister(); close(deregistered) }()
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if !reg.(*registration).dead.Load() {
			return errors.New("Deregister has not started")
		}
		return nil
	})
	select {
	case <-deregistered:
		t.Fatalf("Deregister returned while the server was still writing from the memory")
	default:
	}
	if !serverWriting(server, reg) {
		t.Fatalf("server stopped writing although nobody read")
	}

	resp, payload, err := c.response()
	if err != nil || resp.status != statusOK || resp.id != 1 {
		t.Fatalf("first response: %+v, %v", resp, err)
	}
	if !bytes.Equal(payload, mem[:MaxRequestBytes]) {
		t.Fatalf("first response payload differs")
	}
	<-deregistered
	if serverWriting(server, reg) {
		t.Fatalf("server still writing after Deregister returned")
	}
	clear(mem) // the memory is the caller's again
	for i := 2; i <= 3; i++ {
		resp, _, err := c.response()
		if err != nil || resp.status != statusNotRegistered || resp.id != uint64(i) {
			t.Fatalf("response %d after Deregister: %+v, %v", i, resp, err)
		}
	}
}

// TestDeregisterStalledReader: a reader that never drains its socket holds
// Deregister up for DeregisterGrace at most; its connection is cut.
func TestDeregisterStalledReader(t *testing.T) {
	checkNoLeaks(t)
	const grace = 100 * time.Millisecond
	server := openBackend(t, Config{DeregisterGrace: grace})
	mem := randomBytes(23, MaxRequestBytes+4096)
	reg, err := server.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	c := dialRaw(t, server)
	c.get(1, reg.RemoteKey(), 0, MaxRequestBytes)
	c.get(2, reg.RemoteKey(), MaxRequestBytes, 4096)
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if !serverWriting(server, reg) {
			return errors.New("server not writing yet")
		}
		return nil
	})
	start := time.Now()
	_ = reg.Deregister()
	took := time.Since(start)
	if took < grace || took > grace+2*time.Second {
		t.Fatalf("Deregister took %v with a %v grace", took, grace)
	}
	if serverWriting(server, reg) {
		t.Fatalf("server still writing after Deregister returned")
	}
	// The connection was cut: reading eventually hits EOF or reset.
	_ = c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, c.nc); err != nil && !isReset(err) {
		t.Fatalf("stalled reader's connection not closed: %v", err)
	}
	_ = reg.Deregister() // idempotent
}

// TestDeregisterDuringGet deregisters while a real Get streams from the
// memory and then scribbles over it: the Get either delivers the original
// bytes or fails with ErrNotRegistered.
func TestDeregisterDuringGet(t *testing.T) {
	checkNoLeaks(t)
	server := openBackend(t, Config{})
	client := openBackend(t, Config{ChunkBytes: 256 << 10})
	ep := connect(t, client, server)
	orig := randomBytes(29, 16<<20)
	mem := make([]byte, len(orig))
	dst := make([]byte, len(orig))
	scribble := bytes.Repeat([]byte{0xFF}, len(orig))
	midFlight := 0
	const attempts = 3
	for attempt := range attempts {
		copy(mem, orig)
		reg, err := server.Register(mem)
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			errc <- ep.Get(context.Background(), []transport.GetOp{{RemoteKey: reg.RemoteKey(), Dst: dst}})
		}()
		var getErr error
		done := false
		checkFor(t, 10*time.Second, 20*time.Microsecond, func() error {
			select {
			case getErr = <-errc:
				done = true
				return nil
			default:
			}
			if serverWriting(server, reg) {
				return nil
			}
			return errors.New("transfer not started")
		})
		_ = reg.Deregister()
		if serverWriting(server, reg) {
			t.Fatalf("attempt %d: server writing after Deregister returned", attempt)
		}
		copy(mem, scribble)
		if !done {
			midFlight++
			getErr = <-errc
		}
		switch {
		case getErr == nil:
			if !bytes.Equal(dst, orig) {
				t.Fatalf("attempt %d: Get succeeded with wrong bytes", attempt)
			}
		case errors.Is(getErr, transport.ErrNotRegistered):
		default:
			t.Fatalf("attempt %d: Get failed with %v", attempt, getErr)
		}
	}
	t.Logf("%d of %d deregistrations hit a Get in flight", midFlight, attempts)
}

// TestConnectUnreachable: nobody listens => ErrPeerGone; expired ctx =>
// ErrTimeout.
func TestConnectUnreachable(t *testing.T) {
	checkNoLeaks(t)
	client := openBackend(t, Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := []byte(ln.Addr().String())
	_ = ln.Close()
	_, err = client.Connect(context.Background(), addr)
	wantErr(t, err, transport.ErrPeerGone)
	ctx, cancel := context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	_, err = client.Connect(ctx, addr)
	wantErr(t, err, transport.ErrTimeout)
	_, err = client.Connect(context.Background(), nil)
	wantErr(t, err, transport.ErrPeerGone)
}

// fakeHolder is a hand-written holder for one connection that a test steers
// frame by frame.
type fakeHolder struct {
	ln       net.Listener
	accepted atomic.Int32
	conns    chan net.Conn
}

func newFakeHolder(t *testing.T) *fakeHolder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &fakeHolder{ln: ln, conns: make(chan net.Conn, 4)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(h.conns)
				return
			}
			h.accepted.Add(1)
			h.conns <- c
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		for c := range h.conns {
			_ = c.Close()
		}
	})
	return h
}

// accept returns the next connection after exchanging hellos.
func (h *fakeHolder) accept(t *testing.T) net.Conn {
	t.Helper()
	c := <-h.conns
	var hello [helloLen]byte
	if _, err := io.ReadFull(c, hello[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(appendHello(nil)); err != nil {
		t.Fatal(err)
	}
	return c
}

// nextGet reads frames until a GET, skipping CANCELs.
func nextGet(t *testing.T, c net.Conn) request {
	t.Helper()
	for {
		var b [requestLen]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			t.Fatal(err)
		}
		r, err := decodeRequest(b[:])
		if err != nil {
			t.Fatal(err)
		}
		if r.op == opGet {
			return r
		}
	}
}

// TestKickMidPayload: a Get whose deadline passes while its payload is half
// received returns promptly, the rest of that payload never lands in its
// Dst, and the same connection then serves the next Get.
func TestKickMidPayload(t *testing.T) {
	checkNoLeaks(t)
	holder := newFakeHolder(t)
	client := openBackend(t, Config{ConnsPerEndpoint: 1})
	ep, err := client.Connect(context.Background(), []byte(holder.ln.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	c := holder.accept(t)

	const n = 1 << 20
	resume := make(chan struct{})
	served := make(chan error, 1)
	go func() {
		served <- func() error {
			req := nextGet(t, c)
			hdr := make([]byte, responseLen)
			putResponse(hdr, response{id: req.id, status: statusOK, length: req.length})
			if _, err := c.Write(append(hdr, bytes.Repeat([]byte{0xAA}, n/2)...)); err != nil {
				return err
			}
			<-resume
			if _, err := c.Write(bytes.Repeat([]byte{0xBB}, n/2)); err != nil {
				return err
			}
			req = nextGet(t, c)
			putResponse(hdr, response{id: req.id, status: statusOK, length: req.length})
			_, err := c.Write(append(hdr, bytes.Repeat([]byte{0xCC}, int(req.length))...))
			return err
		}()
	}()

	dst1 := make([]byte, n)
	const deadline = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	start := time.Now()
	err = ep.Get(ctx, []transport.GetOp{{RemoteKey: anyKey, Dst: dst1}})
	took := time.Since(start)
	cancel()
	wantErr(t, err, transport.ErrTimeout)
	if took > deadline+500*time.Millisecond {
		t.Fatalf("Get took %v with a %v deadline", took, deadline)
	}
	snapshot := append([]byte(nil), dst1...)
	if bytes.IndexByte(dst1, 0xAA) < 0 {
		t.Fatalf("the first half never arrived; the test did not stop mid-payload")
	}

	close(resume)
	dst2 := make([]byte, 4096)
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	err = ep.Get(ctx, []transport.GetOp{{RemoteKey: anyKey, Dst: dst2}})
	cancel()
	if err != nil {
		t.Fatalf("get on the kicked connection: %v", err)
	}
	if !bytes.Equal(dst2, bytes.Repeat([]byte{0xCC}, len(dst2))) {
		t.Fatalf("second get: payload differs")
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst1, snapshot) || bytes.IndexByte(dst1, 0xBB) >= 0 {
		t.Fatalf("the abandoned payload kept landing in Dst after Get returned")
	}
	if got := holder.accepted.Load(); got != 1 {
		t.Fatalf("%d connections; the kick should have kept the first one", got)
	}
}

// TestCancelQueued: a CANCEL reaches a GET the server has read ahead but not
// answered, which is then answered with status canceled and no payload.
func TestCancelQueued(t *testing.T) {
	checkNoLeaks(t)
	server := openBackend(t, Config{})
	mem := randomBytes(37, MaxRequestBytes+4096)
	reg := register(t, server, mem)
	c := dialRaw(t, server)
	c.get(1, reg.RemoteKey(), 0, MaxRequestBytes) // blocks the writer: nobody reads
	c.get(2, reg.RemoteKey(), 0, 4096)
	c.get(3, reg.RemoteKey(), 4096, 4096)
	if _, err := c.nc.Write(appendCancel(nil, 2)); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		server.mu.Lock()
		defer server.mu.Unlock()
		for sc := range server.conns {
			sc.qmu.Lock()
			canceled := sc.queued[2]
			sc.qmu.Unlock()
			if canceled {
				return nil
			}
		}
		return errors.New("cancel not seen yet")
	})
	want := []struct {
		id     uint64
		status uint8
		data   []byte
	}{
		{1, statusOK, mem[:MaxRequestBytes]},
		{2, statusCanceled, nil},
		{3, statusOK, mem[4096:8192]},
	}
	for _, w := range want {
		r, payload, err := c.response()
		if err != nil || r.id != w.id || r.status != w.status || !bytes.Equal(payload, w.data) {
			t.Fatalf("response %d: got %+v (%d bytes), %v; want status %d", w.id, r, len(payload), err, w.status)
		}
	}
}
