//go:build ucx && cgo

package ucx

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// TestRegisterExtents: one checked key over several extents of a buffer;
// the holder serves reads inside an extent and refuses the rest.
func TestRegisterExtents(t *testing.T) {
	h := openT(t, "")
	r := openT(t, "")
	mem := randBytes(1<<16, 9)
	reg, err := h.RegisterExtents(mem, []transport.Extent{{Off: 64, Len: 64}, {Off: 4096, Len: 8192}, {Off: 60000, Len: 5536}})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Deregister()
	ep := connectT(t, r, h)
	get := func(off, n uint64) ([]byte, error) {
		dst := make([]byte, n)
		err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + off, Dst: dst}})
		return dst, err
	}
	for _, ok := range [][2]uint64{{64, 64}, {100, 28}, {4096, 8192}, {6000, 100}, {60000, 5536}} {
		got, err := get(ok[0], ok[1])
		if err != nil || !bytes.Equal(got, mem[ok[0]:ok[0]+ok[1]]) {
			t.Fatalf("read [%d,+%d): %v", ok[0], ok[1], err)
		}
	}
	for _, bad := range [][2]uint64{{0, 1}, {63, 2}, {127, 2}, {128, 1}, {2000, 10}, {12287, 2}, {59999, 1}} {
		if _, err := get(bad[0], bad[1]); !errors.Is(err, transport.ErrNotRegistered) {
			t.Fatalf("read [%d,+%d) outside the extents: want ErrNotRegistered, got %v", bad[0], bad[1], err)
		}
	}
	// Adjacent extents are one range: a read running from one into the
	// next (as a reader joins adjacent ops) is served; the bytes just
	// past them are not.
	adj, err := h.RegisterExtents(mem, []transport.Extent{{Off: 1024, Len: 1024}, {Off: 2048, Len: 1024}, {Off: 3072, Len: 512}})
	if err != nil {
		t.Fatal(err)
	}
	defer adj.Deregister()
	dst := make([]byte, 2560)
	if err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: adj.RemoteKey(), RemoteAddr: adj.RemoteAddr() + 1024, Dst: dst}}); err != nil || !bytes.Equal(dst, mem[1024:3584]) {
		t.Fatalf("read across adjacent extents: %v", err)
	}
	if err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: adj.RemoteKey(), RemoteAddr: adj.RemoteAddr() + 3000, Dst: make([]byte, 585)}}); !errors.Is(err, transport.ErrNotRegistered) {
		t.Fatalf("read past adjacent extents: want ErrNotRegistered, got %v", err)
	}
	if _, err := h.RegisterExtents(mem, []transport.Extent{{Off: 100, Len: 10}, {Off: 50, Len: 10}}); err == nil {
		t.Fatal("unsorted extents accepted")
	}
	one, err := OpenConfig(transport.Options{}, Config{Reads: ReadsOneSided})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	if _, err := one.RegisterExtents(mem, []transport.Extent{{Off: 0, Len: 8}}); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("onesided RegisterExtents: want ErrUnsupported, got %v", err)
	}
}
