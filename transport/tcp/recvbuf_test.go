package tcp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// socketPair returns both ends of a loopback TCP connection.
func socketPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return client, server
}

// hiddenConn hides the socket from recvBuf (as a TLS connection does).
type hiddenConn struct{ net.Conn }

// TestRecvBufReadsAheadInOneCall: a read into the caller's memory takes
// what follows it on the socket into the buffer in the same call (readv),
// so the next header needs no read of its own; without a socket (TLS) the
// buffer reads as bufio does. Both deliver the same bytes.
func TestRecvBufReadsAheadInOneCall(t *testing.T) {
	stream := randomBytes(7, 16+20000+16+300)
	for _, tc := range []struct {
		name string
		wrap func(net.Conn) net.Conn
		// buffered after reading the 16-byte header and the 20000-byte
		// payload, on loopback where a written stream is there at once
		ahead int
	}{
		{"readv", func(c net.Conn) net.Conn { return c }, 16 + 300},
		{"plain", func(c net.Conn) net.Conn { return hiddenConn{c} }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc, sc := socketPair(t)
			c := &clientConn{nc: tc.wrap(cc)}
			b := newRecvBuf(c, 4096)
			if got := b.raw != nil; got != (tc.name == "readv") {
				t.Fatalf("readv path %v, want %v", got, tc.name == "readv")
			}
			if _, err := sc.Write(stream); err != nil {
				t.Fatal(err)
			}
			// Wait until the whole stream is in the socket's receive
			// queue (loopback may deliver it a moment later), so what one
			// read returns does not depend on timing.
			raw, err := cc.(*net.TCPConn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			checkFor(t, 10*time.Second, time.Millisecond, func() error {
				var queued int
				var ierr error
				if err := raw.Control(func(fd uintptr) { queued, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
					return err
				}
				if ierr != nil {
					return ierr
				}
				if queued < len(stream) {
					return fmt.Errorf("%d of %d bytes queued", queued, len(stream))
				}
				return nil
			})
			hdr := make([]byte, 16)
			if _, err := io.ReadFull(b, hdr); err != nil {
				t.Fatal(err)
			}
			payload := make([]byte, 20000)
			if _, err := io.ReadFull(b, payload); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(hdr, stream[:16]) || !bytes.Equal(payload, stream[16:20016]) {
				t.Fatal("bytes differ from the stream's")
			}
			if got := b.w - b.r; got != tc.ahead {
				t.Fatalf("%d bytes buffered after the payload, want %d", got, tc.ahead)
			}
			if c.lastRecv.Load() == 0 {
				t.Fatal("lastRecv not stamped")
			}
			// Discard across the buffer and the socket.
			if n, err := b.Discard(16 + 100); n != 116 || err != nil {
				t.Fatalf("Discard: %d, %v", n, err)
			}
			rest := make([]byte, 200)
			if _, err := io.ReadFull(b, rest); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(rest, stream[len(stream)-200:]) {
				t.Fatal("bytes after Discard differ from the stream's")
			}
			// A read deadline in the past (the Get's kick) ends a read
			// that waits.
			_ = c.nc.SetReadDeadline(time.Now().Add(-time.Second))
			if _, err := b.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read past its deadline: %v, want ErrDeadlineExceeded", err)
			}
			_ = c.nc.SetReadDeadline(time.Time{})
			_ = sc.Close()
			if _, err := b.Read(make([]byte, 8)); !errors.Is(err, io.EOF) {
				t.Fatalf("read after the peer closed: %v, want EOF", err)
			}
		})
	}
}
