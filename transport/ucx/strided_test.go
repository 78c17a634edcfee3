//go:build ucx && cgo

package ucx

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// TestGetStrided reads strided ops (16 pieces of 1 KiB, 3 KiB apart at the
// holder, 2 KiB apart here) from a holder's shared allocation, copied from
// the mapping without a GetOp per piece, and from memory the holder
// registered itself (its pieces read as GetOps); every piece lands where
// it belongs and nothing between them is written. A span past the
// registration, and overlapping pieces, are refused before any read.
func TestGetStrided(t *testing.T) {
	const n = 1 << 20
	cases := []struct {
		name      string
		shared    string
		allocated bool
		mapped    bool
	}{
		{"shared-mapped", SharedReadsMap, true, true},
		{"shared-get", SharedReadsGet, true, false},
		{"registered", SharedReadsMap, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, r := openT(t, ""), openShared(t, c.shared)
			var mem []byte
			if c.allocated {
				mem = allocT(t, h, n).Bytes()
			} else {
				mem = make([]byte, n)
			}
			src := randBytes(n, 9)
			copy(mem, src)
			reg, err := h.Register(mem)
			if err != nil {
				t.Fatal(err)
			}
			defer reg.Deregister()
			ep := connectT(t, r, h)
			se := ep
			const piece, count = 1 << 10, 16
			dst := bytes.Repeat([]byte{0xEE}, 2*count*piece)
			ops := []transport.StridedOp{
				{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + 4096, RemoteStride: 3 * piece, Dst: dst[:(count-1)*2*piece+piece], DstStride: 2 * piece, Len: piece, Count: count},
				{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + 100, Dst: dst[piece : 2*piece], Len: piece, Count: 1},
			}
			before := r.mappedGets.Load()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := se.GetStrided(ctx, ops); err != nil {
				t.Fatal(err)
			}
			for i := range count {
				got := dst[2*i*piece : 2*i*piece+piece]
				if want := src[4096+3*i*piece : 4096+3*i*piece+piece]; !bytes.Equal(got, want) {
					t.Fatalf("piece %d differs", i)
				}
			}
			if !bytes.Equal(dst[piece:2*piece], src[100:100+piece]) {
				t.Fatal("the single-piece op differs")
			}
			if !bytes.Equal(dst[3*piece:4*piece], bytes.Repeat([]byte{0xEE}, piece)) {
				t.Fatal("a byte between two pieces was written")
			}
			if mapped := r.mappedGets.Load() - before; (mapped > 0) != c.mapped {
				t.Fatalf("%d mapped copies, want them: %v", mapped, c.mapped)
			}
			past := []transport.StridedOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + n - 4*piece, RemoteStride: 2 * piece, Dst: dst, DstStride: piece, Len: piece, Count: 4}}
			if err := se.GetStrided(ctx, past); !errors.Is(err, transport.ErrNotRegistered) {
				t.Fatalf("a span past the registration: %v, want ErrNotRegistered", err)
			}
			overlap := []transport.StridedOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), RemoteStride: piece, Dst: dst, DstStride: piece / 2, Len: piece, Count: 4}}
			if err := se.GetStrided(ctx, overlap); err == nil {
				t.Fatal("overlapping destination pieces were accepted")
			}
		})
	}
}
