package tcp

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// rawConn dials b's data plane and sends a hello, as a hostile client that
// then sends nothing would.
func rawConn(t *testing.T, b *Backend) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", string(b.Address()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if _, err := nc.Write(appendHello(nil, ProtocolVersion)); err != nil {
		t.Fatal(err)
	}
	return nc
}

// closedByServer waits until the server closed nc (a read returns EOF or a
// reset rather than timing out).
func closedByServer(t *testing.T, nc net.Conn, within time.Duration) {
	t.Helper()
	checkFor(t, within, 10*time.Millisecond, func() error {
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		var b [64]byte
		for {
			_, err := nc.Read(b[:])
			if err == nil {
				continue // the server's hello
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				return fmt.Errorf("connection still open")
			}
			return nil
		}
	})
}

// TestIdleConnectionsAreDropped: a connection that sends its hello and
// then nothing is closed after IdleTimeout, so idle connections cannot
// hold the server's slots; a reader's own pooled connection is retired by
// the reader first (ClientIdle) and its next Get redials transparently.
func TestIdleConnectionsAreDropped(t *testing.T) {
	srv := openBackend(t, Config{IdleTimeout: 300 * time.Millisecond, ClientIdle: 100 * time.Millisecond})
	cli := openBackend(t, Config{IdleTimeout: 300 * time.Millisecond, ClientIdle: 100 * time.Millisecond})
	idle := rawConn(t, srv)
	closedByServer(t, idle, 5*time.Second)

	src := randomBytes(1, 64<<10)
	reg := register(t, srv, src)
	ep := connect(t, cli, srv)
	get := func() {
		t.Helper()
		dst := make([]byte, len(src))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := ep.Get(ctx, []transport.GetOp{{RemoteKey: reg.RemoteKey(), Dst: dst}}); err != nil {
			t.Fatalf("get: %v", err)
		}
	}
	get()
	// Past both timeouts: the reader redials instead of using a dead connection.
	checkFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		srv.mu.Lock()
		n := len(srv.conns)
		srv.mu.Unlock()
		if n != 0 {
			return fmt.Errorf("%d served connections, want 0 once idle", n)
		}
		return nil
	})
	get()
}

// TestConnectionsPerPeerAreCapped: beyond MaxConnsPerPeer, a peer's new
// connections are closed at accept.
func TestConnectionsPerPeerAreCapped(t *testing.T) {
	srv := openBackend(t, Config{MaxConnsPerPeer: 3})
	var open []net.Conn
	for range 3 {
		open = append(open, rawConn(t, srv))
	}
	counted := func(want int) {
		t.Helper()
		checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
			srv.mu.Lock()
			n := srv.perPeer["127.0.0.1"]
			srv.mu.Unlock()
			if n != want {
				return fmt.Errorf("%d connections counted for 127.0.0.1, want %d", n, want)
			}
			return nil
		})
	}
	counted(3)
	closedByServer(t, rawConn(t, srv), 5*time.Second)
	// One goes away: a slot is free again.
	open[0].Close()
	counted(2)
	again := rawConn(t, srv)
	_ = again.SetReadDeadline(time.Now().Add(2 * time.Second))
	var hello [helloLen]byte
	if _, err := again.Read(hello[:]); err != nil {
		t.Fatalf("a connection within the cap got no hello: %v", err)
	}
}

// TestStrangersCannotTakeSlots (issue 29, finding 10): connections that
// never finish their handshake — strangers without a certificate, or who
// send nothing — from one address and from many, up to every slot, do not
// keep a member out: slots are counted after the handshake, and the
// oldest pending connection makes room for a newer one. Before, slots were
// counted at accept and the member's Get failed.
func TestStrangersCannotTakeSlots(t *testing.T) {
	pool, cert := testCA(t, "127.0.0.1")
	cfg := tlsConfigs(pool, cert)
	cfg.MaxConns, cfg.MaxConnsPerPeer = 8, 4
	srv, cli := openBackend(t, cfg), openBackend(t, cfg)
	src := randomBytes(7, 64<<10)
	reg := register(t, srv, src)
	var strangers []net.Conn
	t.Cleanup(func() {
		for _, c := range strangers {
			c.Close()
		}
	})
	// 2 × MaxConns connections from 8 loopback addresses (127.0.0.1
	// included, the member's own) that never start TLS. (A plaintext hello
	// fails the handshake at once.)
	for i := range 2 * cfg.MaxConns {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i%8))}, Timeout: 2 * time.Second}
		c, err := d.Dial("tcp", string(srv.Address()))
		if err != nil {
			t.Fatal(err)
		}
		strangers = append(strangers, c)
	}
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		srv.mu.Lock()
		n := len(srv.conns)
		srv.mu.Unlock()
		if n != cfg.MaxConns {
			return fmt.Errorf("%d connections at the server, want the strangers at the cap (%d)", n, cfg.MaxConns)
		}
		return nil
	})
	ep := connect(t, cli, srv)
	dst := make([]byte, len(src))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ep.Get(ctx, []transport.GetOp{{RemoteKey: reg.RemoteKey(), Dst: dst}}); err != nil {
		t.Fatalf("a member's Get while strangers hold every slot: %v", err)
	}
	srv.mu.Lock()
	served, pending := srv.served, len(srv.pending)
	srv.mu.Unlock()
	if served < 1 || served > DefaultConfig().ConnsPerEndpoint || pending > cfg.MaxConns {
		t.Fatalf("served %d (the member's only), pending %d (at most %d)", served, pending, cfg.MaxConns)
	}
}
