//go:build ucx && cgo

package ucx

/*
#define _GNU_SOURCE
#include <sys/uio.h>
*/
import "C"

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/connex/connex/transport"
)

// One-sided reads on one host: the reader copies the holder's memory with
// process_vm_readv(2) (Linux "cross memory attach", what UCX's cma transport
// does), from the calling goroutine, without the holder's CPU or UCX. UCX
// 1.13 itself never routes ucp_get_nbx of host memory over cma (its protocol
// table says "software emulation" for every transport list), see doc.go.

const (
	// cmaPieceBytes splits long ranges so that several goroutines share
	// them and a canceled Get stops within one piece.
	cmaPieceBytes = 1 << 20
	// cmaCallBytes and cmaCallIovs bound one process_vm_readv call
	// (the kernel's limit is IOV_MAX = 1024 vectors).
	cmaCallBytes = 4 << 20
	cmaCallIovs  = 1024
	// cmaMaxReaders bounds the goroutines one Get uses.
	cmaMaxReaders = 4
)

// errCMADenied means the kernel refused process_vm_readv (EPERM: no ptrace
// access, e.g. Yama ptrace_scope >= 1 or another user); the Get falls back
// to UCX.
var errCMADenied = errors.New("ucx: cma: process_vm_readv not permitted")

var (
	selfOnce sync.Once
	selfP    procID
	selfErr  error
)

// selfProc identifies this process for one-sided keys.
func selfProc() (procID, error) {
	selfOnce.Do(func() {
		host, err := hostID()
		if err != nil {
			selfErr = err
			return
		}
		pid := os.Getpid()
		start, err := procStart(pid)
		if err != nil {
			selfErr = err
			return
		}
		selfP = procID{pid: uint32(pid), start: start, host: host}
	})
	return selfP, selfErr
}

// hostID hashes the kernel's boot id and this process's pid namespace: two
// processes with the same value can name each other by pid.
func hostID() ([16]byte, error) {
	var id [16]byte
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return id, err
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return id, err
	}
	sum := sha256.Sum256([]byte(string(bytes.TrimSpace(boot)) + "|" + ns))
	copy(id[:], sum[:])
	return id, nil
}

// procStart is field 22 of /proc/<pid>/stat: when the process started, in
// clock ticks since boot.
func procStart(pid int) (uint64, error) {
	start, _, err := procStat(pid)
	return start, err
}

// procStat reads a process's start time (field 22 of /proc/<pid>/stat, in
// clock ticks since boot) and state (field 3: R, S, D, T, Z, X, ...) with
// one read.
func procStat(pid int) (start uint64, state byte, err error) {
	var buf [512]byte
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	n, err := f.Read(buf[:])
	f.Close()
	if err != nil {
		return 0, 0, err
	}
	b := buf[:n]
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, fmt.Errorf("ucx: bad /proc/%d/stat", pid)
	}
	f2 := bytes.Fields(b[i+1:]) // f2[0] is field 3 (state)
	if len(f2) < 20 {
		return 0, 0, fmt.Errorf("ucx: short /proc/%d/stat", pid)
	}
	start, err = strconv.ParseUint(string(f2[19]), 10, 64)
	return start, f2[0][0], err
}

// statAlive is checkAlive's slow path: it fails with ErrPeerGone unless p
// is still the process that handed out the key, and still running (a
// killed process stays in /proc as a zombie until its parent reaps it).
func statAlive(p procID) error {
	start, state, err := procStat(int(p.pid))
	if err != nil || start != p.start {
		return fmt.Errorf("%w: holder process %d is gone", transport.ErrPeerGone, p.pid)
	}
	if state == 'Z' || state == 'X' {
		return fmt.Errorf("%w: holder process %d has exited", transport.ErrPeerGone, p.pid)
	}
	return nil
}

type iovec struct {
	base uintptr
	len  uint64
}

type cmaCall struct{ lo, hi int } // a range of the iovec arrays

// cmaRead serves a Get with process_vm_readv when every key is a onesided
// key of one process on this host and the kernel has not refused CMA on
// this endpoint. handled is false when it did not serve it: then UCX does.
func (h *Endpoint) cmaRead(ctx context.Context, ops []transport.GetOp, keys []keyInfo, runs []run) (handled bool, err error) {
	e := h.e
	p, ok := cmaTarget(keys)
	if !ok || e.noCMA.Load() {
		return false, nil
	}
	var pin runtime.Pinner
	for i := range ops {
		if len(ops[i].Dst) > 0 {
			pin.Pin(&ops[i].Dst[0])
		}
	}
	err = cmaGet(ctx, p, runs)
	pin.Unpin()
	if !errors.Is(err, errCMADenied) {
		return true, err
	}
	// No ptrace access to the holder: use UCX from now on.
	if e.noCMA.CompareAndSwap(false, true) {
		e.b.log.Warn("ucx: one-sided CMA reads not permitted; falling back to ucp_get_nbx", "err", err)
	}
	return false, nil
}

// cmaTarget reports whether every key is a one-sided key of one process on
// this host, so that the Get can be served with process_vm_readv.
func cmaTarget(keys []keyInfo) (procID, bool) {
	self, err := selfProc()
	if err != nil || len(keys) == 0 {
		return procID{}, false
	}
	p := keys[0].rk.proc
	for _, k := range keys {
		if k.rk.kind != keyOneSided || k.rk.proc != p {
			return procID{}, false
		}
	}
	return p, p.host == self.host
}

// cmaGet copies runs from process p into this process. Every run lies
// inside an extent its key carries (checked by plan).
func cmaGet(ctx context.Context, p procID, runs []run) error {
	if err := checkAlive(p); err != nil {
		return err
	}
	var local, remote []iovec
	for _, r := range runs {
		for off := uint64(0); off < r.n; {
			n := min(r.n-off, cmaPieceBytes)
			local = append(local, iovec{uintptr(r.local + off), n})
			remote = append(remote, iovec{uintptr(r.remote + off), n})
			off += n
		}
	}
	var calls []cmaCall
	for lo := 0; lo < len(local); {
		hi, bytes := lo, uint64(0)
		for hi < len(local) && hi-lo < cmaCallIovs && (hi == lo || bytes+local[hi].len <= cmaCallBytes) {
			bytes += local[hi].len
			hi++
		}
		calls = append(calls, cmaCall{lo, hi})
		lo = hi
	}
	readers := min(len(calls), runtime.GOMAXPROCS(0), cmaMaxReaders)
	var next atomic.Int64
	var failed atomic.Bool
	errs := make([]error, readers)
	var wg sync.WaitGroup
	for g := 0; g < readers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= len(calls) {
					return
				}
				if err := ctx.Err(); err != nil {
					errs[g] = transport.CtxErr(err)
					failed.Store(true)
					return
				}
				c := calls[i]
				if err := processVMReadv(p.pid, local[c.lo:c.hi], remote[c.lo:c.hi]); err != nil {
					errs[g] = err
					failed.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	runtime.KeepAlive(local)
	runtime.KeepAlive(remote)
	if err := errors.Join(errs...); err != nil {
		if errors.Is(err, transport.ErrTimeout) || errors.Is(err, transport.ErrCanceled) {
			return err
		}
		if errors.Is(err, transport.ErrNotRegistered) || errors.Is(err, errCMADenied) {
			// A dead holder (pid reused meanwhile, or its memory torn
			// down while exiting) reads as gone, not as a bad range.
			if aerr := checkAlive(p); aerr != nil {
				return aerr
			}
		}
		return err
	}
	// The holder must have been alive for the whole copy: if the pid now
	// names another process, the bytes may be someone else's.
	return checkAlive(p)
}

func processVMReadv(pid uint32, local, remote []iovec) error {
	want := uint64(0)
	for _, v := range local {
		want += v.len
	}
	for {
		// The iovecs hold addresses as integers, not Go pointers; the
		// destinations are pinned by the caller.
		n, err := C.process_vm_readv(C.pid_t(pid),
			(*C.struct_iovec)(unsafe.Pointer(&local[0])), C.ulong(len(local)),
			(*C.struct_iovec)(unsafe.Pointer(&remote[0])), C.ulong(len(remote)), 0)
		var e syscall.Errno
		if n < 0 {
			e, _ = err.(syscall.Errno)
			if e == 0 {
				return fmt.Errorf("ucx: cma: process_vm_readv from %d: %v", pid, err)
			}
		}
		switch e {
		case 0:
			if uint64(n) != want {
				// The kernel stops at the first remote byte it cannot
				// read: part of the range is no longer mapped.
				return fmt.Errorf("%w: cma: read %d of %d bytes from process %d", transport.ErrNotRegistered, n, want, pid)
			}
			return nil
		case syscall.EINTR:
			continue
		case syscall.ESRCH:
			return fmt.Errorf("%w: cma: process %d is gone", transport.ErrPeerGone, pid)
		case syscall.EFAULT:
			return fmt.Errorf("%w: cma: process %d has no such memory", transport.ErrNotRegistered, pid)
		case syscall.EPERM, syscall.EACCES:
			return fmt.Errorf("%w (pid %d): %v", errCMADenied, pid, e)
		default:
			return fmt.Errorf("ucx: cma: process_vm_readv from %d: %v", pid, e)
		}
	}
}
