package tcp

import (
	"io"
	"syscall"
)

// recvBuf is a reader connection's receive buffer: bufio.Reader's Read and
// Discard, except that a read into the caller's memory (a payload's Dst)
// also reads what follows it on the socket (the next response's header and
// the start of its payload) into the buffer, in the same readv(2). A
// response then costs one system call instead of two: one for its header
// (through the buffer) and one for the rest of its payload. Where the
// connection is not a plain socket (TLS), reads go through the buffer as
// bufio's do. Every read that returns bytes stamps the connection's
// lastRecv, so that a Get that gives up can tell a frozen connection from a
// busy one.
type recvBuf struct {
	c    *clientConn
	raw  syscall.RawConn // nil: no readv (TLS, or not a socket)
	buf  []byte
	r, w int // buf[r:w] is read and not yet consumed
}

// newRecvBuf returns c's receive buffer of size bytes.
func newRecvBuf(c *clientConn, size int) *recvBuf {
	b := &recvBuf{c: c, buf: make([]byte, size)}
	if sc, ok := c.nc.(syscall.Conn); ok && readvSupported {
		if raw, err := sc.SyscallConn(); err == nil {
			b.raw = raw
		}
	}
	return b
}

// Read reads into p: what the buffer holds first, else from the socket
// (with the bytes after p's into the buffer where readv is there).
func (b *recvBuf) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if b.r < b.w {
		n := copy(p, b.buf[b.r:b.w])
		b.r += n
		return n, nil
	}
	b.r, b.w = 0, 0
	if b.raw == nil {
		if len(p) >= len(b.buf) {
			return b.read(p)
		}
		if err := b.fill(); err != nil {
			return 0, err
		}
		n := copy(p, b.buf[:b.w])
		b.r = n
		return n, nil
	}
	n, err := b.readv(p)
	if n > len(p) {
		b.w = n - len(p)
		n = len(p)
	}
	return n, err
}

// Discard skips n bytes.
func (b *recvBuf) Discard(n int) (int, error) {
	done := 0
	for done < n {
		if b.r == b.w {
			if err := b.fill(); err != nil {
				return done, err
			}
		}
		m := min(n-done, b.w-b.r)
		b.r += m
		done += m
	}
	return done, nil
}

// fill reads into the empty buffer.
func (b *recvBuf) fill() error {
	b.r, b.w = 0, 0
	n, err := b.read(b.buf)
	b.w = n
	if n > 0 {
		return nil
	}
	return err
}

// read is one read(2) from the connection into p.
func (b *recvBuf) read(p []byte) (int, error) {
	n, err := b.c.nc.Read(p)
	if n > 0 {
		b.c.lastRecv.Store(monoNow())
	}
	return n, err
}

// readv is one readv(2) into p and then the (empty) buffer; it returns the
// bytes read into both.
func (b *recvBuf) readv(p []byte) (int, error) {
	var (
		n     int
		errno error
	)
	iov := [2][]byte{p, b.buf}
	err := b.raw.Read(func(fd uintptr) bool {
		n, errno = readv(int(fd), iov[:])
		return errno != syscall.EAGAIN
	})
	if err == nil {
		err = errno
	}
	if n > 0 {
		b.c.lastRecv.Store(monoNow())
		return n, nil
	}
	if n < 0 {
		n = 0
	}
	if err == nil {
		err = io.EOF
	}
	return n, err
}
