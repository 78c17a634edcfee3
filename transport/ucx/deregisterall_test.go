//go:build ucx && cgo

package ucx

import (
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

// BenchmarkDeregisterAll deregisters 4096 onesided registrations (a
// scattered hold's keys) one by one and at once, and prints both and their
// ratio (the reference is one by one, measured in the same run).
func BenchmarkDeregisterAll(b *testing.B) {
	h := openOneSided(b)
	const n = 4096
	var one, all time.Duration
	for range b.N {
		_, regs := registerPieces(b, h, n)
		t0 := time.Now()
		for _, reg := range regs {
			if err := reg.Deregister(); err != nil {
				b.Fatal(err)
			}
		}
		one += time.Since(t0)
		_, regs = registerPieces(b, h, n)
		t0 = time.Now()
		if err := h.DeregisterAll(regs); err != nil {
			b.Fatal(err)
		}
		all += time.Since(t0)
	}
	perKey := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N*n) }
	b.ReportMetric(perKey(one), "us/key-one-by-one")
	b.ReportMetric(perKey(all), "us/key-at-once")
	fmt.Printf("DEREGISTER keys=%d one_by_one_us_per_key=%.2f at_once_us_per_key=%.2f speedup=%.1f\n",
		n, perKey(one), perKey(all), float64(one)/float64(all))
}
