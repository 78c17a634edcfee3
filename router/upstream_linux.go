package router

import (
	"net"
	"syscall"
)

// stillOpen reports whether an idle connection can carry a request: the
// engine has not closed it (a peek finds neither its end nor stray bytes).
// net/http learns this from a read it keeps pending on every idle
// connection; one non-blocking peek at reuse costs less than that
// goroutine.
func stillOpen(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	var buf [1]byte
	cerr := rc.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		_ = n
		open = err == syscall.EAGAIN || err == syscall.EWOULDBLOCK
		return true // never wait
	})
	return cerr == nil && open
}
