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

func openOneSided(t testing.TB) *Backend {
	t.Helper()
	b, err := OpenConfig(transport.Options{}, Config{Reads: ReadsOneSided})
	if err != nil {
		t.Fatalf("open ucx onesided: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestReadsConfig(t *testing.T) {
	if _, err := OpenConfig(transport.Options{}, Config{Reads: "raw"}); err == nil {
		t.Fatal("Reads=raw accepted")
	}
	if os.Getenv("UCX_TLS") == "" {
		b := openOneSided(t)
		if b.Reads() != ReadsOneSided || b.TLS() != OneSidedDefaultTLS || !b.w.errPeer {
			t.Fatalf("onesided: reads %q tls %q peer %v", b.Reads(), b.TLS(), b.w.errPeer)
		}
		if c := openT(t, ""); c.Reads() != ReadsChecked || c.TLS() != SafeDefaultTLS {
			t.Fatalf("default: reads %q tls %q", c.Reads(), c.TLS())
		}
	}
}

// TestOneSidedGet: every byte, contiguous and in shuffled 32 KiB pieces,
// over CMA and over the ucp_get_nbx fallback; out-of-range ops are refused
// by the reader before anything is posted.
func TestOneSidedGet(t *testing.T) {
	for _, viaUCX := range []bool{false, true} {
		name := map[bool]string{false: "cma", true: "ucp_get_nbx"}[viaUCX]
		t.Run(name, func(t *testing.T) {
			h, r := openOneSided(t), openOneSided(t)
			src := randBytes(16<<20, 11)
			reg, err := h.Register(src[4096 : len(src)-4096])
			if err != nil {
				t.Fatal(err)
			}
			k, err := parseKey(reg.RemoteKey())
			if err != nil || k.kind != keyOneSided || int(k.proc.pid) != os.Getpid() {
				t.Fatalf("key kind %d pid %d: %v", k.kind, k.proc.pid, err)
			}
			ep := connectT(t, r, h)
			ep.(*Endpoint).e.noCMA.Store(viaUCX)
			key, base, n := reg.RemoteKey(), reg.RemoteAddr(), reg.Len()
			want := src[4096 : len(src)-4096]
			dst := make([]byte, n)
			if err := getT(ep, 10*time.Second, []transport.GetOp{{RemoteKey: key, RemoteAddr: base, Dst: dst}}); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dst, want) {
				t.Fatal("contiguous: bytes differ")
			}
			const block = 32 << 10
			l := layout{size: n - n%block, pieces: n / block, block: block}
			clear(dst)
			ops := pieceOps(l, key, base, dst)
			if err := getT(ep, 10*time.Second, ops); err != nil {
				t.Fatal(err)
			}
			for _, op := range ops {
				off := op.RemoteAddr - base
				if !bytes.Equal(op.Dst, want[off:off+uint64(len(op.Dst))]) {
					t.Fatalf("piece at %d differs", off)
				}
			}
			for _, c := range []struct {
				name string
				addr uint64
				len  int
			}{
				{"before", base - 4096, 4096},
				{"straddles end", base + uint64(n) - 1, 2},
				{"past end", base + uint64(n), 1},
			} {
				err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: key, RemoteAddr: c.addr, Dst: make([]byte, c.len)}})
				if !errors.Is(err, transport.ErrNotRegistered) {
					t.Errorf("%s: got %v, want ErrNotRegistered", c.name, err)
				}
			}
			if h.Caps().ExtentKeys {
				t.Error("onesided backend claims ExtentKeys: its keys are not checked against extents")
			}
		})
	}
}

// TestOneSidedDeregisterThenGet records what a GET with a key kept past
// Deregister does in onesided mode: it cannot be revoked. While the caller
// keeps the memory mapped, the GET returns the bytes; once the memory is
// unmapped it fails with ErrNotRegistered. Neither process crashes.
func TestOneSidedDeregisterThenGet(t *testing.T) {
	for _, viaUCX := range []bool{false, true} {
		name := map[bool]string{false: "cma", true: "ucp_get_nbx"}[viaUCX]
		t.Run(name, func(t *testing.T) {
			h, r := openOneSided(t), openOneSided(t)
			const size = 1 << 20
			mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
			if err != nil {
				t.Fatal(err)
			}
			src := randBytes(size, 12)
			copy(mem, src)
			reg, err := h.Register(mem)
			if err != nil {
				t.Fatal(err)
			}
			ep := connectT(t, r, h)
			ep.(*Endpoint).e.noCMA.Store(viaUCX)
			dst := make([]byte, size)
			op := []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: dst}}
			if err := getT(ep, 5*time.Second, op); err != nil {
				t.Fatal(err)
			}
			if err := reg.Deregister(); err != nil {
				t.Fatal(err)
			}
			clear(dst)
			err = getT(ep, 5*time.Second, op)
			t.Logf("GET after Deregister, memory still mapped: %v (old bytes returned: %v)", err, bytes.Equal(dst, src))
			if err != nil && !errors.Is(err, transport.ErrNotRegistered) {
				t.Fatalf("GET after Deregister: %v", err)
			}
			if viaUCX {
				// Over UCX the GET is emulated by the holder's CPU, which
				// would copy from unmapped memory and crash (see doc.go):
				// the lease protocol, not the transport, must prevent it.
				syscall.Munmap(mem)
				return
			}
			if err := syscall.Munmap(mem); err != nil {
				t.Fatal(err)
			}
			err = getT(ep, 5*time.Second, op)
			t.Logf("GET after Deregister and munmap: %v", err)
			if !errors.Is(err, transport.ErrNotRegistered) {
				t.Fatalf("GET of unmapped memory: got %v, want ErrNotRegistered", err)
			}
		})
	}
}

// TestOneSidedCanceled: a Get whose context ends stops copying instead of
// finishing the whole range first: one that reports the timeout left
// destination bytes uncopied. (How soon it returns is
// BenchmarkGetPastDeadline's figure.)
func TestOneSidedCanceled(t *testing.T) {
	h, r := openOneSided(t), openOneSided(t)
	src := randBytes(256<<20, 13)
	reg, err := h.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	ep := connectT(t, r, h)
	dst := make([]byte, len(src))
	took, err := getWithin(t, ep, time.Millisecond, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: dst}})
	t.Logf("1 ms deadline on a 256 MiB Get: %v after %v", err, took)
	if err != nil && !errors.Is(err, transport.ErrTimeout) {
		t.Fatalf("got %v", err)
	}
	if err != nil && bytes.Equal(dst, src) {
		t.Fatal("the Get timed out only after copying all 256 MiB")
	}
}
