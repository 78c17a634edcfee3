package tcp

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/connex/connex/transport"
)

// errDstFault fails one GetOp whose destination faulted while the reader
// copied into it: the destination is a region whose file shrank (its
// engine truncated it).
var errDstFault = fmt.Errorf("%w: the destination faulted while the reader wrote into it", transport.ErrFault)

// errSrcFault fails one GetOp that the holder refused because its source
// faulted (statusFault).
var errSrcFault = fmt.Errorf("%w: the holder's memory faulted: its region file shrank", transport.ErrFault)

// touchPages reads one byte of every page of p and reports whether none
// faulted. A holder touches a GET's source before writev(2) sends it, so a
// region whose file shrank is refused with statusFault and a clear error
// rather than failing the whole connection with EFAULT.
func touchPages(p []byte) bool {
	return !faulted(func() {
		var sink byte
		for off := 0; off < len(p); off += pageBytes {
			sink |= p[off]
		}
		sink |= p[len(p)-1]
		runtime.KeepAlive(sink)
	})
}

// faulted runs f and reports whether it hit a memory fault, which it
// survives (a panic of any other kind goes on).
func faulted(f func()) (hit bool) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if v := recover(); v != nil {
			// A memory fault panics with a runtime.Error that has Addr.
			if _, isFault := v.(interface{ Addr() uintptr }); !isFault {
				panic(v)
			}
			hit = true
		}
	}()
	f()
	return false
}

// pageBytes is the stride of touchPages: the smallest page size.
const pageBytes = 4096

// readCatchingFaults is br.ReadV(iov), except that a fault on iov returns
// errDstFault instead of killing the process with SIGBUS. A fault consumes
// nothing from br: recvBuf advances only once its copies are done, and
// readv(2) that fails with EFAULT leaves the socket's bytes queued, so the
// caller can discard the payload and keep the connection.
func readCatchingFaults(br *recvBuf, iov [][]byte) (n int, err error) {
	if faulted(func() { n, err = br.ReadV(iov) }) {
		return 0, errDstFault
	}
	if errors.Is(err, syscall.EFAULT) {
		return n, errDstFault
	}
	return n, err
}
