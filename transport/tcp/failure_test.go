package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// silentPeer is a TCP listener that accepts connections and reads them but
// never answers: a holder whose process is frozen.
type silentPeer struct {
	*rawPeer
	got atomic.Int64 // bytes received on all connections
}

func newSilentPeer(t testing.TB) *silentPeer {
	t.Helper()
	p := &silentPeer{}
	p.rawPeer = newRawPeer(t, func(_ int, c net.Conn) {
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			p.got.Add(int64(n))
			if err != nil {
				return
			}
		}
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
		elapsed, err := getWithin(t, ep, deadline, op)
		wantErr(t, err, transport.ErrTimeout)
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
	errc := make(chan error, 1)
	go func() { errc <- ep.Get(cctx, op) }()
	err = waitGet(t, cctx, errc)
	lag := time.Duration(monoNow() - canceledAt.Load())
	wantErr(t, err, transport.ErrCanceled)
	t.Logf("returned %v after cancel", lag)
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
		finish, _ := getWhileWriting(t, ep, server, reg, dst, 50*time.Microsecond)
		_ = server.Close()
		err := finish()
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
