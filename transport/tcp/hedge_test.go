package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// TestSilentConns: a connection is silent when it has received nothing for
// longer than the limit since the later of its last receive and the oldest
// request of the Get on it.
func TestSilentConns(t *testing.T) {
	conn := func(lastRecv int64) *clientConn {
		c := &clientConn{}
		c.lastRecv.Store(lastRecv)
		return c
	}
	busy, quiet, idleThenAsked, unsent := conn(950), conn(100), conn(10), conn(10)
	inflight := []*pendingReq{
		{conn: busy, sent: 200},
		{conn: quiet, sent: 300}, {conn: quiet, sent: 150},
		{conn: idleThenAsked, sent: 900}, // idle for long, asked just now
		{conn: unsent},                   // not written yet
		{},                               // not on a connection yet
	}
	got := silentConns(inflight, 1000, 500)
	if len(got) != 1 || got[0] != quiet {
		t.Fatalf("silent: %v, want only the quiet connection", got)
	}
	if got := silentConns(inflight, 1000, 900); len(got) != 0 {
		t.Fatalf("silent with a 900 limit: %d connections, want none", len(got))
	}
}

// hedgeHolder is a holder speaking the wire protocol by hand: it answers
// every GET with bytes derived from the offset, except on the connections
// mute says to keep silent (by accept order), which read requests and never
// answer.
type hedgeHolder struct {
	*rawPeer
	mu       sync.Mutex
	closedBy map[int]chan struct{} // per mute connection: closed when the reader cut it
}

// hedgeSetup starts a hedge holder and connects a reader with two
// connections, chunks of hedgeChunk and hedgeAfter. Connect dials slot 0
// then slot 1, so connection 1 is the second slot's, and every Get spreads
// its chunks over both.
func hedgeSetup(t *testing.T, mute func(k int) bool, hedgeAfter time.Duration) (*hedgeHolder, transport.Endpoint) {
	t.Helper()
	h := &hedgeHolder{closedBy: map[int]chan struct{}{}}
	h.rawPeer = newRawPeer(t, func(k int, c net.Conn) {
		var cut chan struct{}
		if mute(k) {
			cut = make(chan struct{})
			h.mu.Lock()
			h.closedBy[k] = cut
			h.mu.Unlock()
		}
		h.serve(c, cut)
	})
	client := openBackend(t, Config{ConnsPerEndpoint: 2, ChunkBytes: hedgeChunk, HedgeAfter: hedgeAfter})
	ep, err := client.Connect(context.Background(), []byte(h.ln.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ep.Close() })
	return h, ep
}

// cut counts the mute connections the reader has closed.
func (h *hedgeHolder) cut() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.closedBy {
		select {
		case <-c:
			n++
		default:
		}
	}
	return n
}

const hedgeChunk = 64 << 10

// hedgeByte is the content of byte off of the hedge holder's memory.
func hedgeByte(off uint64) byte { return byte(off*7 + off>>8) }

// serve runs one connection; cut non-nil makes it mute, and is closed when
// the reader closes the connection.
func (h *hedgeHolder) serve(c net.Conn, cut chan struct{}) {
	var hello [helloLen]byte
	if _, err := io.ReadFull(c, hello[:]); err != nil {
		return
	}
	if _, err := c.Write(appendHello(nil, ProtocolVersion)); err != nil {
		return
	}
	for {
		var b [requestLen]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			if cut != nil {
				close(cut)
			}
			return
		}
		r, err := decodeRequest(b[:])
		if err != nil || r.op != opGet || cut != nil {
			continue
		}
		out := make([]byte, responseLen, responseLen+int(r.length))
		putResponse(out, response{id: r.id, status: statusOK, length: r.length})
		for i := range uint64(r.length) {
			out = append(out, hedgeByte(r.offset+i))
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// TestHedgeSilentConnection: a Get whose requests sit on a connection that
// went silent while the holder answers on the other one completes: the
// silent connection is cut after HedgeAfter and its requests are answered
// elsewhere. With hedging off, the same Get times out.
func TestHedgeSilentConnection(t *testing.T) {
	checkNoLeaks(t)
	ops := func() ([]transport.GetOp, []byte) {
		dst := make([]byte, 8*hedgeChunk)
		return []transport.GetOp{{RemoteKey: anyKey, Dst: dst}}, dst
	}
	want := make([]byte, 8*hedgeChunk)
	for i := range want {
		want[i] = hedgeByte(uint64(i))
	}
	second := func(k int) bool { return k == 1 }
	t.Run("hedged", func(t *testing.T) {
		h, ep := hedgeSetup(t, second, 100*time.Millisecond)
		op, dst := ops()
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		start := time.Now()
		if err := ep.Get(ctx, op); err != nil {
			t.Fatalf("get with one silent connection: %v", err)
		}
		if !bytes.Equal(dst, want) {
			t.Fatal("payload differs from the holder's memory")
		}
		// The reader closed the silent connection before the Get could
		// complete; the holder sees that close when its goroutine reads
		// the end of the stream, a moment later.
		checkFor(t, 5*time.Second, time.Millisecond, func() error {
			if n := h.cut(); n != 1 {
				return fmt.Errorf("the Get completed but %d silent connections were seen closed, want 1", n)
			}
			return nil
		})
		t.Logf("completed in %v with one connection silent (HedgeAfter 100ms)", time.Since(start).Round(time.Millisecond))
	})
	t.Run("off", func(t *testing.T) {
		_, ep := hedgeSetup(t, second, -1)
		op, _ := ops()
		_, err := getWithin(t, ep, time.Second, op)
		wantErr(t, err, transport.ErrTimeout)
	})
	t.Run("frozen", func(t *testing.T) {
		// Every connection silent, redials too: the Get ends with its
		// context, having cut at most ConnsPerEndpoint connections.
		h, ep := hedgeSetup(t, func(int) bool { return true }, 50*time.Millisecond)
		op, _ := ops()
		_, err := getWithin(t, ep, time.Second, op)
		wantErr(t, err, transport.ErrTimeout)
		if errors.Is(err, transport.ErrPeerGone) {
			t.Fatalf("a frozen holder must time out, not look gone: %v", err)
		}
		// This Get's cuts, plus those the end of the Get may make of
		// connections that look frozen.
		if n := h.cut(); n > 2+2 {
			t.Fatalf("%d connections cut during one Get; at most ConnsPerEndpoint by hedging", n)
		}
	})
}

// TestProgressWhileBytesArrive: a Get whose one request is answered slowly
// reports progress(0) while its payload is still arriving, before the
// request completes and reports its bytes.
func TestProgressWhileBytesArrive(t *testing.T) {
	checkNoLeaks(t)
	const n = 64 << 10
	finish := make(chan struct{})
	h := newRawPeer(t, func(_ int, c net.Conn) {
		var hello [helloLen]byte
		if _, err := io.ReadFull(c, hello[:]); err != nil {
			return
		}
		if _, err := c.Write(appendHello(nil, ProtocolVersion)); err != nil {
			return
		}
		var b [requestLen]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return
		}
		r, err := decodeRequest(b[:])
		if err != nil {
			return
		}
		out := make([]byte, responseLen, responseLen+n)
		putResponse(out, response{id: r.id, status: statusOK, length: r.length})
		out = append(out, bytes.Repeat([]byte{0x5A}, n)...)
		if _, err := c.Write(out[:responseLen+n/2]); err != nil {
			return
		}
		<-finish
		_, _ = c.Write(out[responseLen+n/2:])
	})
	client := openBackend(t, Config{ConnsPerEndpoint: 1, HedgeAfter: -1})
	ep, err := client.Connect(context.Background(), []byte(h.ln.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	var calls []int
	sawZero := make(chan struct{})
	errc := make(chan error, 1)
	dst := make([]byte, n)
	go func() {
		errc <- ep.GetProgress(context.Background(), []transport.GetOp{{RemoteKey: anyKey, Dst: dst}}, func(m int) {
			if m == 0 && len(calls) == 0 {
				close(sawZero)
			}
			calls = append(calls, m)
		})
	}()
	select {
	case <-sawZero:
	case err := <-errc:
		close(finish)
		t.Fatalf("Get ended (%v) without reporting the half payload that arrived", err)
	case <-time.After(hangGuard):
		close(finish)
		t.Fatal("no progress reported in 10 s while half the payload had arrived")
	}
	close(finish)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if last := calls[len(calls)-1]; last != n {
		t.Fatalf("progress calls %v: want the request's %d bytes last", calls, n)
	}
}
