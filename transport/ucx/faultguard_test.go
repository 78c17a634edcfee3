//go:build ucx && cgo

package ucx

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// mapFile maps a new file of n bytes read-write and shared, as connexd
// maps an engine's region file.
func mapFile(t *testing.T, n int) (string, []byte) {
	t.Helper()
	dir := "/dev/shm"
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		dir = t.TempDir()
	}
	f, err := os.CreateTemp(dir, "connex-fault-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(f.Name()) })
	defer f.Close()
	if err := f.Truncate(int64(n)); err != nil {
		t.Fatal(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	return filepath.Clean(f.Name()), mem
}

// TestFaultGuardSource: a checked GET of registered memory whose file
// shrank fails with ErrFault, the guard reports the range broken, and the
// process (holder and reader here) lives; a later GET of it is refused too.
func TestFaultGuardSource(t *testing.T) {
	const n = 1 << 20
	h, r := openT(t, ""), openT(t, "")
	path, mem := mapFile(t, n)
	copy(mem, randBytes(n, 1))
	g, err := h.Guard(mem)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release()
	reg, err := h.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Deregister()
	ep := connectT(t, r, h)
	ok := transport.GetOp{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: make([]byte, 4096)}
	if err := getT(ep, 5*time.Second, []transport.GetOp{ok}); err != nil {
		t.Fatalf("get before the truncation: %v", err)
	}
	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	if g.Broken() {
		t.Fatal("broken before anything touched the truncated pages")
	}
	past := transport.GetOp{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + 8192, Dst: make([]byte, 64<<10)}
	for i := range 2 {
		if err := getT(ep, 5*time.Second, []transport.GetOp{past}); !errors.Is(err, transport.ErrFault) {
			t.Fatalf("get %d past the file's new end: %v, want ErrFault", i, err)
		}
		if !g.Broken() {
			t.Fatalf("after get %d the guard does not report the range broken", i)
		}
	}
	// The first page is broken too now (the whole range was replaced):
	// nothing of a broken region is served.
	if err := getT(ep, 5*time.Second, []transport.GetOp{ok}); !errors.Is(err, transport.ErrFault) {
		t.Fatalf("get of the still-backed first page of a broken range: %v, want ErrFault", err)
	}
	g.Release()
	if !g.Broken() {
		t.Fatal("Broken changed its answer after Release")
	}
}

// TestFaultGuardDestination: a GET into a destination whose file shrank
// fails with ErrFault, and the destination's guard reports it.
func TestFaultGuardDestination(t *testing.T) {
	const n = 1 << 20
	h, r := openT(t, ""), openT(t, "")
	src := randBytes(n, 2)
	reg, err := h.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Deregister()
	path, dst := mapFile(t, n)
	g, err := r.Guard(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Release()
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	ep := connectT(t, r, h)
	op := transport.GetOp{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: dst[4096 : 4096+(256<<10)]}
	if err := getT(ep, 5*time.Second, []transport.GetOp{op}); !errors.Is(err, transport.ErrFault) {
		t.Fatalf("get into a truncated destination: %v, want ErrFault", err)
	}
	if !g.Broken() {
		t.Fatal("the destination's guard does not report the range broken")
	}
	// Another destination, and the same endpoint, still work.
	good := make([]byte, 4096)
	if err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: good}}); err != nil {
		t.Fatalf("get into a good destination after the fault: %v", err)
	}
	if string(good) != string(src[:4096]) {
		t.Fatal("get into a good destination after the fault: wrong bytes")
	}
}

// TestFaultGuardUnguardedMapping: with the guard installed, a read in Go
// of a file mapping nobody guards, past its file's end, reads zeros and
// is counted (a reader's copy from a holder's segment is such a read).
func TestFaultGuardUnguardedMapping(t *testing.T) {
	if err := installFaultGuard(); err != nil {
		t.Fatal(err)
	}
	path, mem := mapFile(t, 3*4096)
	mem[2*4096] = 7
	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	before := faults()
	if b := mem[2*4096]; b != 0 {
		t.Fatalf("read past the end: %d, want 0", b)
	}
	if faults() != before+1 {
		t.Fatalf("faults went from %d to %d, want one more", before, faults())
	}
	if err := faultedDuring(before, []transport.GetOp{{Dst: mem[2*4096:]}}, false); !errors.Is(err, transport.ErrFault) {
		t.Fatalf("faultedDuring over the faulted page: %v, want ErrFault", err)
	}
	if err := faultedDuring(before, []transport.GetOp{{Dst: make([]byte, 64)}}, false); err != nil {
		t.Fatalf("faultedDuring over another range: %v", err)
	}
}
