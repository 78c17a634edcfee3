//go:build ucx && cgo

package ucx

/*
#include <stdlib.h>
#include "cx.h"
*/
import "C"

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"github.com/connex/connex/transport"
)

// Shared allocations: memory UCX allocates (UCP_MEM_MAP_ALLOCATE on the
// posix transport, a /dev/shm file), that connexd hands to an engine to use
// as its KV region, and that readers on the same host GET truly one-sided:
// the reader's UCX maps the holder's segment when it unpacks the rkey, and
// each ucp_get_nbx is a memcpy by the reader's CPU. See doc.go, "Shared
// regions".

// Allocation is memory from Backend.Allocate. It implements
// transport.Allocation.
type Allocation struct {
	b    *Backend
	reg  *Registration // alloc: UCX's memory handle and packed rkey
	rkey []byte        // UCX's packed rkey for the whole allocation
	id   uint64        // random; tells reused addresses and fds apart
	path string
	// under b.mu
	views int // live registrations on this memory
	freed bool
}

var _ transport.Allocation = (*Allocation)(nil)
var _ transport.Allocator = (*Backend)(nil)

// Allocate has UCX allocate n bytes of POSIX shared memory and returns it
// with the path other processes map it by (transport.Allocator).
// Registrations on this memory (Register, RegisterExtents) hand out shared
// keys: a checked key, as for any memory, plus the allocation's UCX rkey, so
// that a reader on this host reads one-sided and any other reader through
// the checked protocol. It fails when the posix transport is not in use
// (Config.TLS or UCX_TLS without posix or sm) or UCX's memory is not a file
// another process can open.
func (b *Backend) Allocate(n int) (transport.Allocation, error) {
	if n <= 0 {
		return nil, fmt.Errorf("ucx: allocate: bad size %d", n)
	}
	if _, err := selfProc(); err != nil {
		return nil, fmt.Errorf("ucx: allocate: cannot identify this process: %w", err)
	}
	// UCX's posix transport puts the file in UCX_POSIX_DIR (/dev/shm);
	// asking for more than it holds would only fail later, and slowly.
	dir := os.Getenv("UCX_POSIX_DIR")
	if dir == "" {
		dir = "/dev/shm"
	}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(dir, &fs); err == nil && fs.Blocks > 0 && uint64(n) > fs.Bavail*uint64(fs.Bsize) {
		return nil, fmt.Errorf("ucx: allocate %d bytes: %s has %d bytes free", n, dir, fs.Bavail*uint64(fs.Bsize))
	}
	var idb [8]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return nil, err
	}
	r := &Registration{b: b, n: n, alloc: true, rma: true}
	if err := b.mapMem(r, nil); err != nil {
		return nil, fmt.Errorf("ucx: allocate %d bytes: %w", n, err)
	}
	rk, err := parseKey(r.key)
	if err != nil { // our own key: cannot happen
		b.freeAlloc(r)
		return nil, err
	}
	path, err := sharedPath(r.base)
	if err != nil {
		b.freeAlloc(r)
		return nil, fmt.Errorf("ucx: allocate: %w", err)
	}
	a := &Allocation{b: b, reg: r, rkey: bytes.Clone(rk.rkey), id: binary.LittleEndian.Uint64(idb[:]), path: path}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, transport.ErrClosed // Close unmapped r with the rest
	}
	b.allocs = append(b.allocs, a)
	return a, nil
}

// Bytes is the allocated memory, valid until Free.
func (a *Allocation) Bytes() []byte { return unsafe.Slice((*byte)(a.reg.ptr), a.reg.n) }

// Path is what another process of this host opens to map the memory.
func (a *Allocation) Path() string { return a.path }

// Free unmaps the memory (ucp_mem_unmap). It fails while registrations on
// it are live. Processes that mapped Path keep their mappings, and readers
// that cached the rkey keep theirs until their endpoint closes, so freeing
// never makes a peer fault. Idempotent.
func (a *Allocation) Free() error {
	b := a.b
	b.mu.Lock()
	if a.freed {
		b.mu.Unlock()
		return nil
	}
	if a.views > 0 {
		b.mu.Unlock()
		return fmt.Errorf("ucx: free: %d registrations still use the allocation", a.views)
	}
	a.freed = true
	for i, x := range b.allocs {
		if x == a {
			b.allocs = append(b.allocs[:i], b.allocs[i+1:]...)
			break
		}
	}
	b.mu.Unlock()
	return b.freeAlloc(a.reg)
}

func (b *Backend) freeAlloc(r *Registration) error {
	b.mu.Lock()
	if r.gone { // Close took it (and unmaps it)
		b.mu.Unlock()
		return nil
	}
	r.gone = true
	delete(b.regs, r)
	b.mu.Unlock()
	var err error
	if cerr := b.w.call(func() { err = b.w.unmap(r) }); cerr != nil {
		return nil // the worker is gone, and with it the mapping
	}
	return err
}

// allocFor returns the live allocation that contains mem, taking a view on
// it, or nil. Under b.mu.
func (b *Backend) allocFor(mem []byte) *Allocation {
	p := uintptr(unsafe.Pointer(&mem[0]))
	for _, a := range b.allocs {
		if p >= a.reg.base && p-a.reg.base+uintptr(len(mem)) <= uintptr(a.reg.n) {
			a.views++
			return a
		}
	}
	return nil
}

// sharedPath finds the file backing the mapping that contains addr (from
// /proc/self/maps) and returns a path another process can open: the file
// itself, or /proc/<pid>/fd/<n> when it was unlinked (UCX's default
// UCX_POSIX_USE_PROC_LINK=y unlinks it at once and keeps the descriptor).
func sharedPath(addr uintptr) (string, error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode path
		line := sc.Text()
		fs := strings.Fields(line)
		if len(fs) < 6 {
			continue
		}
		lo, hi, ok := strings.Cut(fs[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || uint64(addr) < start || uint64(addr) >= end {
			continue
		}
		ino, _ := strconv.ParseUint(fs[4], 10, 64)
		path := strings.Join(fs[5:], " ")
		if ino == 0 || !strings.HasPrefix(path, "/") || strings.HasPrefix(path, "/SYSV") {
			return "", fmt.Errorf("memory at %#x is not a shareable file (%q): UCX allocated it with another method; the posix transport is needed", addr, path)
		}
		if !strings.HasSuffix(path, " (deleted)") {
			return path, nil
		}
		return fdPath(strings.TrimSuffix(path, " (deleted)"), ino)
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("no mapping contains %#x", addr)
}

// fdPath finds this process's descriptor for the unlinked file name with
// inode ino.
func fdPath(name string, ino uint64) (string, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		link, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || strings.TrimSuffix(link, " (deleted)") != name {
			continue
		}
		var st syscall.Stat_t
		if syscall.Stat("/proc/self/fd/"+e.Name(), &st) != nil || st.Ino != ino {
			continue
		}
		return fmt.Sprintf("/proc/%d/fd/%s", os.Getpid(), e.Name()), nil
	}
	return "", fmt.Errorf("no open descriptor for %s (inode %d)", name, ino)
}

// sharedRkey returns u's unpacked rkey for a shared key, and where the
// key's address addr is mapped here, if, and only if, the memory is mapped
// into this process (a same-host shared-memory segment): then reads with it
// are one-sided copies. Otherwise it reports false and the caller uses the
// key's checked path. Both outcomes are cached per endpoint. Loop-owned.
func (w *worker) sharedRkey(u *uep, cacheKey string, packed []byte, addr uint64) (C.ucp_rkey_h, unsafe.Pointer, bool) {
	rk, cached := u.shared[cacheKey]
	if cached && rk == nil {
		return nil, nil, false
	}
	if !cached {
		p := C.CBytes(packed)
		st := C.cx_rkey_unpack(u.c, p, &rk)
		C.free(p)
		if st != C.UCS_OK {
			u.shared[cacheKey] = nil
			return nil, nil, false
		}
	}
	var ptr unsafe.Pointer
	if C.cx_rkey_local(rk, C.uint64_t(addr), &ptr) == 0 {
		C.cx_rkey_destroy(rk)
		u.shared[cacheKey] = nil
		return nil, nil, false
	}
	u.shared[cacheKey] = rk
	return rk, ptr, true
}
