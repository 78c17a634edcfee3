package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

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
	if _, err := c.Write(appendHello(nil, ProtocolVersion)); err != nil {
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
	// Hedging off: the holder's pause mid-payload is what this test steers,
	// and a Get that outlived HedgeAfter would cut the connection it checks.
	client := openBackend(t, Config{ConnsPerEndpoint: 1, HedgeAfter: -1})
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
	took, err := getWithin(t, ep, deadline, []transport.GetOp{{RemoteKey: anyKey, Dst: dst1}})
	wantErr(t, err, transport.ErrTimeout)
	t.Logf("Get timed out after %v with a %v deadline", took, deadline)
	snapshot := append([]byte(nil), dst1...)
	if bytes.IndexByte(dst1, 0xAA) < 0 {
		t.Fatalf("the first half never arrived; the test did not stop mid-payload")
	}

	close(resume)
	dst2 := make([]byte, 4096)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
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
