//go:build ucx && cgo

package ucx

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// allocT allocates n bytes on h, freed at cleanup.
func allocT(t *testing.T, h *Backend, n int) transport.Allocation {
	t.Helper()
	a, err := h.Allocate(n)
	if err != nil {
		t.Fatalf("allocate: %v", err)
	}
	t.Cleanup(func() { a.Free() })
	return a
}

// mapPath maps path as an engine would.
func mapPath(t *testing.T, path string, n int) []byte {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	m, err := syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap %s: %v", path, err)
	}
	t.Cleanup(func() { syscall.Munmap(m) })
	return m
}

func TestAllocateSharedWithEngine(t *testing.T) {
	h := openT(t, "")
	const n = 8 << 20
	a := allocT(t, h, n)
	mem := a.Bytes()
	if len(mem) != n {
		t.Fatalf("Bytes is %d bytes, want %d", len(mem), n)
	}
	// An engine maps the path and writes; connexd's view sees it, and back.
	eng := mapPath(t, a.Path(), n)
	src := randBytes(n, 3)
	copy(eng, src)
	if !bytes.Equal(mem, src) {
		t.Fatal("the allocation does not show what the engine wrote through Path")
	}
	mem[0] ^= 0xFF
	if eng[0] != src[0]^0xFF {
		t.Fatal("the engine's mapping does not show connexd's write")
	}
}

func TestSharedKeyReadsOneSided(t *testing.T) {
	for _, how := range []string{SharedReadsMap, SharedReadsGet} {
		t.Run(how, func(t *testing.T) { sharedKeyReadsOneSided(t, how) })
	}
}

func openShared(t *testing.T, how string) *Backend {
	t.Helper()
	b, err := OpenConfig(transport.Options{}, Config{SharedReads: how})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func sharedKeyReadsOneSided(t *testing.T, how string) {
	h, r := openT(t, ""), openShared(t, how)
	const n = 8 << 20
	a := allocT(t, h, n)
	src := randBytes(n, 4)
	copy(a.Bytes(), src)
	// A hold-like registration: two extents of the second half.
	half := a.Bytes()[n/2:]
	reg, err := h.RegisterExtents(half, []transport.Extent{{Off: 0, Len: 1 << 20}, {Off: 2 << 20, Len: 2 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Deregister()
	ep := connectT(t, r, h)
	dst := make([]byte, 3<<20)
	ops := []transport.GetOp{
		{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: dst[:1<<20]},
		{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + 2<<20, Dst: dst[1<<20:]},
	}
	want := append(bytes.Clone(src[n/2:n/2+1<<20]), src[n/2+2<<20:n/2+4<<20]...)
	if err := getT(ep, 5*time.Second, ops); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, want) {
		t.Fatal("bytes differ")
	}
	// One-sided: it works while the holder's progress loop is stalled,
	// which a checked GET cannot (TestGetDeadlineStalledHolder).
	resume := pauseHolder(t, h)
	defer resume()
	clear(dst)
	if err := getT(ep, 5*time.Second, ops); err != nil {
		t.Fatalf("GET with the holder stalled: %v", err)
	}
	if !bytes.Equal(dst, want) {
		t.Fatal("bytes differ with the holder stalled")
	}
	if mapped := r.mappedGets.Load(); (how == SharedReadsMap) != (mapped == 2) {
		t.Fatalf("%d Gets copied from the mapping with shared_reads=%s", mapped, how)
	}
	// Reads outside the registration are refused before anything is read.
	err = getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() - 4096, Dst: dst[:4096]}})
	if !errors.Is(err, transport.ErrNotRegistered) {
		t.Fatalf("read before the registration: %v, want ErrNotRegistered", err)
	}
}

// A reader that cannot map the holder's segment (no shared-memory
// transport) reads the same key through the checked protocol, which the
// holder enforces: extents hold, and Deregister revokes.
func TestSharedKeyCheckedFallback(t *testing.T) {
	h, r := openT(t, "posix,tcp,self"), openT(t, "tcp,self")
	const n = 4 << 20
	a := allocT(t, h, n)
	src := randBytes(n, 5)
	copy(a.Bytes(), src)
	reg, err := h.RegisterExtents(a.Bytes(), []transport.Extent{{Off: 0, Len: 1 << 20}, {Off: 2 << 20, Len: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	ep := connectT(t, r, h)
	dst := make([]byte, 1<<20)
	if err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + 2<<20, Dst: dst}}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, src[2<<20:3<<20]) {
		t.Fatal("bytes differ")
	}
	// Between the extents: the holder refuses.
	err = getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + 1<<20, Dst: dst[:4096]}})
	if !errors.Is(err, transport.ErrNotRegistered) {
		t.Fatalf("read between extents over the checked path: %v, want ErrNotRegistered", err)
	}
	if err := a.Free(); err == nil {
		t.Fatal("Free with a live registration succeeded")
	}
	if err := reg.Deregister(); err != nil {
		t.Fatal(err)
	}
	err = getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: dst[:4096]}})
	if !errors.Is(err, transport.ErrNotRegistered) {
		t.Fatalf("read after Deregister over the checked path: %v, want ErrNotRegistered", err)
	}
	if err := a.Free(); err != nil {
		t.Fatalf("Free after Deregister: %v", err)
	}
}

// A lingering endpoint caches the segments it mapped. A new allocation
// that reuses a freed one's address (and likely its file descriptor, so
// UCX's rkey bytes repeat) must be read from the new memory.
func TestSharedReusedAddressReadsNewMemory(t *testing.T) {
	h, r := openT(t, ""), openT(t, "")
	const n = 4 << 20
	read := func(reg transport.Registration) []byte {
		t.Helper()
		ep, err := r.Connect(t.Context(), h.Address())
		if err != nil {
			t.Fatal(err)
		}
		defer ep.Close() // lingers: the endpoint read shared memory
		dst := make([]byte, n)
		if err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: dst}}); err != nil {
			t.Fatal(err)
		}
		return dst
	}
	var prevBase uintptr
	reused := false
	for i := range 4 {
		a, err := h.Allocate(n)
		if err != nil {
			t.Fatal(err)
		}
		src := randBytes(n, uint64(10+i))
		copy(a.Bytes(), src)
		reg, err := h.Register(a.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(read(reg), src) {
			t.Fatalf("allocation %d: read stale or wrong bytes", i)
		}
		base := a.(*Allocation).reg.base
		reused = reused || base == prevBase
		prevBase = base
		if err := reg.Deregister(); err != nil {
			t.Fatal(err)
		}
		if err := a.Free(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("an address was reused: %v", reused)
	r.mu.Lock()
	eps := len(r.eps)
	var e *endpoint
	for _, x := range r.eps {
		e = x
	}
	r.mu.Unlock()
	if eps != 1 {
		t.Fatalf("%d endpoints kept, want the one lingering endpoint", eps)
	}
	// The lingering endpoint still maps the four freed allocations; idle
	// eviction (run at each lingering Close) unmaps them.
	var before, after int
	r.w.call(func() {
		before = len(e.u.shared)
		r.w.dropIdleShared(e.u, 0)
		after = len(e.u.shared)
	})
	if before != 4 || after != 0 {
		t.Fatalf("shared rkeys before/after idle eviction: %d/%d, want 4/0", before, after)
	}
}

// A mapped copy reads through UCX's mapping of the holder's segment; an
// endpoint closed meanwhile (another Get's deadline force-closes it) must
// not unmap it under the copy.
func TestMappedCopySurvivesEndpointClose(t *testing.T) {
	h, r := openT(t, ""), openT(t, "")
	const n = 128 << 20
	a := allocT(t, h, n)
	src := randBytes(n, 6)
	copy(a.Bytes(), src)
	reg, err := h.Register(a.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Deregister()
	ep := connectT(t, r, h)
	dst := make([]byte, n)
	ops := []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: dst}}
	for round := range 5 {
		clear(dst)
		done := make(chan error, 1)
		go func() { done <- getT(ep, 10*time.Second, ops) }()
		closes := 0
	loop:
		for {
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				break loop
			default:
			}
			r.w.call(func() {
				if u := ep.(*Endpoint).e.u; u != nil && !u.closed {
					r.w.closeEP(u, transport.ErrClosed)
					closes++
				}
			})
		}
		if !bytes.Equal(dst, src) {
			t.Fatalf("round %d: bytes differ", round)
		}
		t.Logf("round %d: %d endpoint closes during the copy", round, closes)
	}
	if r.mappedGets.Load() == 0 {
		t.Fatal("no Get was a mapped copy")
	}
}

// Registrations of one allocation at different offsets share the segment
// mapping; each must read its own bytes, in one Get and across Gets.
func TestSharedKeysAtDifferentOffsets(t *testing.T) {
	for _, how := range []string{SharedReadsMap, SharedReadsGet} {
		t.Run(how, func(t *testing.T) {
			h, r := openT(t, ""), openShared(t, how)
			const n = 4 << 20
			a := allocT(t, h, n)
			src := randBytes(n, 8)
			copy(a.Bytes(), src)
			k1, err := h.Register(a.Bytes()[:1<<20])
			if err != nil {
				t.Fatal(err)
			}
			defer k1.Deregister()
			k2, err := h.Register(a.Bytes()[2<<20:])
			if err != nil {
				t.Fatal(err)
			}
			defer k2.Deregister()
			ep := connectT(t, r, h)
			d1, d2 := make([]byte, 4096), make([]byte, 4096)
			get := func(ops ...transport.GetOp) {
				t.Helper()
				clear(d1)
				clear(d2)
				if err := getT(ep, 5*time.Second, ops); err != nil {
					t.Fatal(err)
				}
			}
			op1 := transport.GetOp{RemoteKey: k1.RemoteKey(), RemoteAddr: k1.RemoteAddr() + 8192, Dst: d1}
			op2 := transport.GetOp{RemoteKey: k2.RemoteKey(), RemoteAddr: k2.RemoteAddr() + 8192, Dst: d2}
			get(op1)
			get(op2) // a second Get through the other key: the cached mapping must not be the first key's
			if !bytes.Equal(d2, src[2<<20+8192:2<<20+8192+4096]) {
				t.Fatal("second key read the wrong bytes")
			}
			get(op2, op1) // both keys in one Get
			if !bytes.Equal(d1, src[8192:8192+4096]) || !bytes.Equal(d2, src[2<<20+8192:2<<20+8192+4096]) {
				t.Fatal("a Get with both keys read the wrong bytes")
			}
		})
	}
}
