package netlab

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"
)

// roundTrip sends n random bytes on c to an echo server behind the relay,
// checks they come back unchanged and returns how long that took.
func roundTrip(t *testing.T, c net.Conn, n int) time.Duration {
	t.Helper()
	msg := make([]byte, n)
	_, _ = rand.Read(msg)
	t0 := time.Now()
	go func() { _, _ = c.Write(msg) }()
	got := make([]byte, n)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("bytes changed in the relay")
	}
	return time.Since(t0)
}

// TestRelayRate: with a rate set, bytes come back intact and a transfer
// takes at least its size over the rate (a lower bound: load only adds).
func TestRelayRate(t *testing.T) {
	r, err := NewRelay("127.0.0.1:0", echoServer(t, "127.0.0.1:0").Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const rate, n = 4 << 20, 1 << 20
	r.SetRate(rate)
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	took := roundTrip(t, c, n)
	if min := time.Duration(n) * time.Second / rate; took < min {
		t.Fatalf("1 MiB through a 4 MiB/s relay in %s, want >= %s", took, min)
	}
	t.Logf("1 MiB echoed through a 4 MiB/s relay in %s", took.Round(time.Millisecond))
}

// TestRelayDelaysEachWay: bytes come back intact through the relay, a
// round trip takes at least twice the delay (a lower bound: load can only
// add to it), a changed delay applies to later bytes, and Close cuts the
// relayed connection.
func TestRelayDelaysEachWay(t *testing.T) {
	const delay = 40 * time.Millisecond
	r, err := NewRelay("127.0.0.1:0", echoServer(t, "127.0.0.1:0").Addr().String(), delay)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if rt := roundTrip(t, c, 1); rt < 2*delay {
		t.Fatalf("round trip %s, want >= %s", rt, 2*delay)
	}
	if rt := roundTrip(t, c, 3<<20); rt < 2*delay {
		t.Fatalf("3 MiB round trip %s, want >= %s", rt, 2*delay)
	}
	r.SetDelay(0)
	roundTrip(t, c, 1) // bytes read before the change may still wait; these do not
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("relayed connection still open after Close")
	}
	if _, err := NewRelay("127.0.0.1:0", "127.0.0.1:1", -time.Second); err == nil {
		t.Fatal("negative delay accepted")
	}
}
