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

// TestRegisterPeriodicExtents: a hold's extents are the same runs of
// blocks in every layer and plane, one plane stride apart, and the holder
// keeps them as one period (cx_period). Reads inside a run of any period
// are served; reads in the gaps, before the first period, past the last,
// or running from one period's last run into the next's first are not, as
// with the plain list.
func TestRegisterPeriodicExtents(t *testing.T) {
	h := openT(t, "")
	r := openT(t, "")
	const stride, periods = 4096, 8
	mem := randBytes(stride*(periods+1), 11)
	var exts []transport.Extent
	for k := uint64(0); k < periods; k++ {
		base := 512 + k*stride
		exts = append(exts, transport.Extent{Off: base, Len: 1024}, transport.Extent{Off: base + 2048, Len: 256}, transport.Extent{Off: base + 3072, Len: 512})
	}
	reg, err := h.RegisterExtents(mem, exts)
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
	for k := uint64(0); k < periods; k++ {
		base := 512 + k*stride
		for _, ok := range [][2]uint64{{base, 1024}, {base + 100, 900}, {base + 2048, 256}, {base + 3072, 512}, {base + 3500, 84}} {
			got, err := get(ok[0], ok[1])
			if err != nil || !bytes.Equal(got, mem[ok[0]:ok[0]+ok[1]]) {
				t.Fatalf("period %d: read [%d,+%d): %v", k, ok[0], ok[1], err)
			}
		}
		for _, bad := range [][2]uint64{{base - 1, 1}, {base + 1024, 1}, {base + 1000, 100}, {base + 2047, 2}, {base + 2300, 10}, {base + 3071, 1}, {base + 3584, 1}, {base + 3500, 100}} {
			if _, err := get(bad[0], bad[1]); !errors.Is(err, transport.ErrNotRegistered) {
				t.Fatalf("period %d: read [%d,+%d) outside the extents: want ErrNotRegistered, got %v", k, bad[0], bad[1], err)
			}
		}
	}
	last := uint64(512 + (periods-1)*stride)
	for _, bad := range [][2]uint64{{0, 1}, {511, 1}, {last + 4096, 1}, {last + 4096 + 512, 64}, {stride*periods + 512 + 2048, 1}} {
		if _, err := get(bad[0], bad[1]); !errors.Is(err, transport.ErrNotRegistered) {
			t.Fatalf("read [%d,+%d) outside every period: want ErrNotRegistered, got %v", bad[0], bad[1], err)
		}
	}
	// The last run of one period and the first of the next are 512 bytes
	// apart: a read across the gap is refused.
	if _, err := get(512+3072+400, 700); !errors.Is(err, transport.ErrNotRegistered) {
		t.Fatalf("read across periods: want ErrNotRegistered, got %v", err)
	}
}
