package transport

import (
	"errors"
	"testing"
)

// TestStridedOpCheck: a strided op whose pieces overlap in the destination,
// overflow it, or whose span wraps past 2^64 is refused; a good one's
// pieces are where it says.
func TestStridedOpCheck(t *testing.T) {
	dst := make([]byte, 100)
	good := StridedOp{RemoteAddr: 1000, RemoteStride: 30, Dst: dst, DstStride: 40, Len: 20, Count: 3}
	if err := good.Check(); err != nil {
		t.Fatal(err)
	}
	if got := good.Span(); got != 2*30+20 {
		t.Fatalf("span %d", got)
	}
	pieces := good.AppendPieces(nil)
	if len(pieces) != 3 || pieces[2].RemoteAddr != 1060 || &pieces[2].Dst[0] != &dst[80] || len(pieces[2].Dst) != 20 || cap(pieces[2].Dst) != 20 {
		t.Fatalf("pieces %+v", pieces)
	}
	for name, op := range map[string]StridedOp{
		"no piece":   {Dst: dst, Len: 1},
		"overlap":    {Dst: dst, DstStride: 10, Len: 20, Count: 2},
		"dst short":  {Dst: dst, DstStride: 40, Len: 30, Count: 3},
		"wraps":      {RemoteAddr: 1, RemoteStride: 1 << 63, Dst: dst, DstStride: 20, Len: 20, Count: 3},
		"addr wraps": {RemoteAddr: ^uint64(0) - 10, Dst: dst, Len: 20, Count: 1},
	} {
		if err := op.Check(); err == nil {
			t.Errorf("%s: accepted", name)
		} else if (name == "wraps" || name == "addr wraps") && !errors.Is(err, ErrNotRegistered) {
			t.Errorf("%s: %v, want ErrNotRegistered", name, err)
		}
	}
}
