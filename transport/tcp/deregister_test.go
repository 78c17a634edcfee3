package tcp

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

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
	if _, err := nc.Write(appendHello(nil, ProtocolVersion)); err != nil {
		t.Fatal(err)
	}
	var hello [helloLen]byte
	if _, err := io.ReadFull(nc, hello[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := decodeHello(hello[:]); err != nil {
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
	reg := register(t, server, mem)
	c := dialRaw(t, server)
	// 16 MiB does not fit in the socket buffers (net.core.wmem_max plus
	// the untouched receive buffer); two small requests queue behind it.
	c.get(1, reg.RemoteKey(), 0, MaxRequestBytes)
	c.get(2, reg.RemoteKey(), MaxRequestBytes, 4096)
	c.get(3, reg.RemoteKey(), 100, 4096)
	// Nobody reads, so the first 16 MiB answer cannot leave the socket.
	waitServerWriting(t, server, reg)
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
	reg := register(t, server, mem)
	c := dialRaw(t, server)
	c.get(1, reg.RemoteKey(), 0, MaxRequestBytes)
	c.get(2, reg.RemoteKey(), MaxRequestBytes, 4096)
	waitServerWriting(t, server, reg)
	start := time.Now()
	_ = reg.Deregister()
	took := time.Since(start)
	if took < grace || took > hangGuard {
		t.Fatalf("Deregister took %v with a %v grace", took, grace)
	}
	t.Logf("Deregister of a stalled reader: %v with a %v grace", took, grace)
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
		finish, done := getWhileWriting(t, ep, server, reg, dst, 20*time.Microsecond)
		_ = reg.Deregister()
		if serverWriting(server, reg) {
			t.Fatalf("attempt %d: server writing after Deregister returned", attempt)
		}
		copy(mem, scribble)
		if !done {
			midFlight++
		}
		getErr := finish()
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
