//go:build ucx && cgo

package ucx

import (
	"fmt"
	"sync"

	"github.com/connex/connex/transport"
	"golang.org/x/sys/unix"
)

// Holder liveness. A read from a holder's memory on this host (mapped
// segments, CMA) succeeds even after the holder died, so every such Get
// checks the holder before or after reading (checkAlive). Reading
// /proc/<pid>/stat for that cost 60–1000 µs per check on the VMs measured
// here (a Go holder has many threads, and syscalls are expensive under
// PTI), on the critical path of every batch of reads. Instead the first
// check of a process opens a pidfd for it and verifies, once, that it is
// the process that handed out the key; later checks poll the pidfd, which
// becomes readable when the process exits: one non-blocking syscall.

// maxWatched bounds the pidfds kept open (one per holder process checked;
// a host runs a handful). Past it, checks fall back to /proc.
const maxWatched = 256

// liveness keeps the pidfds of the holder processes checked so far.
type liveness struct {
	mu  sync.RWMutex
	fds map[procID]int
	// noPidfd: pidfd_open is unavailable (kernel < 5.3, seccomp); every
	// check reads /proc.
	noPidfd bool
}

var holders = &liveness{fds: map[procID]int{}}

// checkAlive fails with ErrPeerGone unless p is still the process that
// handed out the key, and still running.
func checkAlive(p procID) error { return holders.check(p) }

func (l *liveness) check(p procID) error {
	l.mu.RLock()
	fd, ok := l.fds[p]
	if ok {
		exited, err := pidfdExited(fd)
		l.mu.RUnlock()
		if err == nil && !exited {
			return nil
		}
		l.forget(p, fd)
		if err != nil {
			return statAlive(p) // poll failed: decide by /proc this time
		}
		return fmt.Errorf("%w: holder process %d has exited", transport.ErrPeerGone, p.pid)
	}
	noPidfd, full := l.noPidfd, len(l.fds) >= maxWatched
	l.mu.RUnlock()
	if noPidfd || full {
		return statAlive(p)
	}
	return l.watch(p)
}

// watch opens a pidfd for p and keeps it, after checking through /proc
// that the pid still names p: opened first and checked second, the pidfd
// refers to p whenever the check passes (p existed before either step,
// and a reused pid would show a later start time).
func (l *liveness) watch(p procID) error {
	fd, err := unix.PidfdOpen(int(p.pid), 0)
	if err != nil {
		if err == unix.ENOSYS || err == unix.EPERM || err == unix.EINVAL {
			l.mu.Lock()
			l.noPidfd = true
			l.mu.Unlock()
		}
		return statAlive(p) // ESRCH: gone, which statAlive reports
	}
	if err := statAlive(p); err != nil {
		unix.Close(fd)
		return err
	}
	l.mu.Lock()
	if _, dup := l.fds[p]; dup || len(l.fds) >= maxWatched {
		l.mu.Unlock()
		unix.Close(fd)
		return nil
	}
	l.fds[p] = fd
	l.mu.Unlock()
	return nil
}

// forget closes p's pidfd if it is still fd (no check uses it then: checks
// hold the read lock while polling).
func (l *liveness) forget(p procID, fd int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if cur, ok := l.fds[p]; ok && cur == fd {
		delete(l.fds, p)
		unix.Close(fd)
	}
}

// pidfdExited reports whether the process behind pidfd fd has exited
// (a pidfd polls readable from then on, zombie or reaped).
func pidfdExited(fd int) (bool, error) {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(pfd, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("ucx: poll pidfd: %w", err)
		}
		if pfd[0].Revents&unix.POLLNVAL != 0 {
			return false, fmt.Errorf("ucx: poll pidfd %d: not open", fd)
		}
		return n > 0 && pfd[0].Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR) != 0, nil
	}
}
