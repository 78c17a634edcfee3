//go:build ucx && cgo

package ucx

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// registerPieces registers n pieces of 4 KiB of one buffer with h.
func registerPieces(t testing.TB, h *Backend, n int) ([]byte, []transport.Registration) {
	t.Helper()
	mem := randBytes(n*4096, 11)
	regs := make([]transport.Registration, n)
	for i := range regs {
		reg, err := h.Register(mem[i*4096 : (i+1)*4096])
		if err != nil {
			t.Fatalf("register piece %d: %v", i, err)
		}
		regs[i] = reg
	}
	return mem, regs
}

// TestDeregisterAll: DeregisterAll revokes every registration as
// Deregister does (a GET on any key is refused), is idempotent, leaves none
// in the backend's table, and refuses a registration of another backend
// without touching it.
func TestDeregisterAll(t *testing.T) {
	h, r := openT(t, ""), openT(t, "")
	_, regs := registerPieces(t, h, 64)
	ep := connectT(t, r, h)
	get := func(reg transport.Registration) error {
		return getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: make([]byte, 4096)}})
	}
	if err := get(regs[63]); err != nil {
		t.Fatalf("GET before DeregisterAll: %v", err)
	}
	other, err := r.Register(make([]byte, 4096))
	if err != nil {
		t.Fatal(err)
	}
	err = h.DeregisterAll(append(regs[:len(regs):len(regs)], other))
	if err == nil || !strings.Contains(err.Error(), "another backend") {
		t.Fatalf("DeregisterAll with a foreign registration: %v", err)
	}
	for i, reg := range regs {
		if err := get(reg); !errors.Is(err, transport.ErrNotRegistered) {
			t.Fatalf("GET on piece %d after DeregisterAll: %v, want ErrNotRegistered", i, err)
		}
	}
	if err := h.DeregisterAll(regs); err != nil {
		t.Fatalf("second DeregisterAll: %v", err)
	}
	h.mu.Lock()
	left := len(h.regs)
	h.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d registrations left in the backend's table", left)
	}
	if err := other.Deregister(); err != nil {
		t.Fatalf("the foreign registration, untouched by DeregisterAll: %v", err)
	}
}

// TestRegisterMany: RegisterMany gives each buffer a key that reads it, in
// checked and onesided mode; an empty buffer among them fails the call and
// leaves nothing registered.
func TestRegisterMany(t *testing.T) {
	for _, reads := range []string{ReadsChecked, ReadsOneSided} {
		t.Run(reads, func(t *testing.T) {
			h, err := OpenConfig(transport.Options{}, Config{Reads: reads})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			r, err := OpenConfig(transport.Options{}, Config{Reads: reads})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			mem := randBytes(64*4096, 13)
			mems := make([][]byte, 64)
			for i := range mems {
				mems[i] = mem[i*4096 : (i+1)*4096]
			}
			if _, err := h.RegisterMany(append(mems[:8:8], nil)); err == nil {
				t.Fatal("RegisterMany with an empty buffer succeeded")
			}
			h.mu.Lock()
			left := len(h.regs)
			h.mu.Unlock()
			if left != 0 {
				t.Fatalf("%d registrations left by a failed RegisterMany", left)
			}
			regs, err := h.RegisterMany(mems)
			if err != nil {
				t.Fatal(err)
			}
			ep := connectT(t, r, h)
			for i, reg := range regs {
				dst := make([]byte, 4096)
				if err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: dst}}); err != nil {
					t.Fatalf("GET of buffer %d: %v", i, err)
				}
				if !bytes.Equal(dst, mems[i]) {
					t.Fatalf("buffer %d: bytes differ", i)
				}
			}
			if err := h.DeregisterAll(regs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// BenchmarkManyKeys registers and deregisters 4096 onesided keys (a
// scattered hold's) one by one and at once (RegisterMany, DeregisterAll),
// and prints the figures and ratios (the reference is one by one, measured
// in the same run).
func BenchmarkManyKeys(b *testing.B) {
	h := openOneSided(b)
	const n = 4096
	mem := randBytes(n*4096, 11)
	mems := make([][]byte, n)
	for i := range mems {
		mems[i] = mem[i*4096 : (i+1)*4096]
	}
	var regOne, deregOne, regMany, deregAll time.Duration
	for range b.N {
		t0 := time.Now()
		regs := make([]transport.Registration, n)
		for i, m := range mems {
			reg, err := h.Register(m)
			if err != nil {
				b.Fatal(err)
			}
			regs[i] = reg
		}
		regOne += time.Since(t0)
		t0 = time.Now()
		for _, reg := range regs {
			if err := reg.Deregister(); err != nil {
				b.Fatal(err)
			}
		}
		deregOne += time.Since(t0)
		t0 = time.Now()
		regs, err := h.RegisterMany(mems)
		if err != nil {
			b.Fatal(err)
		}
		regMany += time.Since(t0)
		t0 = time.Now()
		if err := h.DeregisterAll(regs); err != nil {
			b.Fatal(err)
		}
		deregAll += time.Since(t0)
	}
	perKey := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(b.N*n) }
	b.ReportMetric(perKey(regMany), "us/key-register-many")
	b.ReportMetric(perKey(deregAll), "us/key-deregister-all")
	fmt.Printf("MANYKEYS keys=%d register_one_by_one_us=%.2f register_many_us=%.2f speedup=%.1f "+
		"deregister_one_by_one_us=%.2f deregister_all_us=%.2f speedup=%.1f\n",
		n, perKey(regOne), perKey(regMany), float64(regOne)/float64(regMany),
		perKey(deregOne), perKey(deregAll), float64(deregOne)/float64(deregAll))
}
