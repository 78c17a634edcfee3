package tcp

import (
	"io"
	"os"
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
	one  [1][]byte
	iov  [][]byte // ReadV's readv vector: the caller's slices and buf

	// readv's call into the socket, made once (a closure per read would
	// be an allocation per read), and what it returns.
	readvFn func(fd uintptr) bool
	n       int
	errno   error
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
	b.one[0] = p
	n, err := b.ReadV(b.one[:])
	b.one[0] = nil
	return n, err
}

// ReadV reads into the slices of iov in turn, at most their summed length:
// what the buffer holds first, else from the socket in one readv(2) (and
// the bytes after them into the buffer). Without readv it reads into the
// first non-empty slice as Read does. The buffer advances only once every copy out of it
// is done, so a fault on a destination (transport.FaultGuard) consumes
// nothing.
func (b *recvBuf) ReadV(iov [][]byte) (int, error) {
	want := 0
	for _, p := range iov {
		want += len(p)
	}
	if want == 0 {
		return 0, nil
	}
	if b.r < b.w {
		r := b.r
		for _, p := range iov {
			r += copy(p, b.buf[r:b.w])
			if r == b.w {
				break
			}
		}
		n := r - b.r
		b.r = r
		return n, nil
	}
	b.r, b.w = 0, 0
	if b.raw == nil {
		p := iov[0]
		if len(p) == 0 {
			for _, q := range iov {
				if len(q) > 0 {
					p = q
					break
				}
			}
		}
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
	b.iov = append(append(b.iov[:0], iov...), b.buf)
	n, err := b.readv(b.iov)
	clear(b.iov) // drop references to the caller's memory
	if n > want {
		b.w = n - want
		n = want
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

// readv is one readv(2) into iov (the caller's slices, then the empty
// buffer); it returns the bytes read into all of them. It waits for the
// socket to be readable as a read does (deadlines included).
func (b *recvBuf) readv(iov [][]byte) (int, error) {
	b.iov = iov
	if b.readvFn == nil {
		b.readvFn = func(fd uintptr) bool {
			for {
				b.n, b.errno = readv(int(fd), b.iov)
				if b.errno != syscall.EINTR {
					return b.errno != syscall.EAGAIN
				}
			}
		}
	}
	err := b.raw.Read(b.readvFn)
	n, errno := b.n, b.errno
	b.n, b.errno = 0, nil
	if err == nil && errno != nil {
		err = os.NewSyscallError("readv", errno)
	}
	if n > 0 {
		b.c.lastRecv.Store(monoNow())
		return n, nil
	}
	if err == nil {
		err = io.EOF
	}
	return 0, err
}
