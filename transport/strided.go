package transport

import (
	"context"
	"fmt"
)

// StridedOp reads Count pieces of Len bytes under RemoteKey: piece i from
// RemoteAddr + i×RemoteStride into Dst[i×DstStride : i×DstStride+Len]. A
// head range of a token-major KV block is one (a piece per token, at the
// block's token stride). Every piece must lie in the key's registered
// memory, as a GetOp's range must.
type StridedOp struct {
	RemoteKey    []byte
	RemoteAddr   uint64
	RemoteStride uint64
	// Dst holds every piece: at least (Count-1)×DstStride + Len bytes.
	Dst        []byte
	DstStride  int
	Len, Count int
}

// Span is how many bytes op's pieces spread over at the holder, from the
// first piece's start to the last piece's end.
func (op StridedOp) Span() uint64 { return uint64(op.Count-1)*op.RemoteStride + uint64(op.Len) }

// Check reports why op cannot be read: no piece, pieces that overlap in
// the destination or overflow Dst, or a span past 2^64.
func (op StridedOp) Check() error {
	switch {
	case op.Count < 1 || op.Len < 0:
		return fmt.Errorf("strided op of %d pieces of %d bytes", op.Count, op.Len)
	case op.Count > 1 && op.DstStride < op.Len:
		return fmt.Errorf("strided op: destination stride %d below the piece length %d (pieces would overlap)", op.DstStride, op.Len)
	case uint64(op.Count-1)*uint64(op.DstStride)+uint64(op.Len) > uint64(len(op.Dst)):
		return fmt.Errorf("strided op: %d pieces of %d bytes %d apart do not fit in %d destination bytes", op.Count, op.Len, op.DstStride, len(op.Dst))
	case op.RemoteStride != 0 && uint64(op.Count-1) > (^uint64(0)-uint64(op.Len))/op.RemoteStride,
		op.RemoteAddr > ^uint64(0)-op.Span():
		return fmt.Errorf("strided op: range %d + %d × %d + %d overflows: %w", op.RemoteAddr, op.Count-1, op.RemoteStride, op.Len, ErrNotRegistered)
	}
	return nil
}

// AppendPieces appends op's pieces to out as GetOps: what a backend without
// native strided reads (Caps.Strided false) reads.
func (op StridedOp) AppendPieces(out []GetOp) []GetOp {
	for i := range op.Count {
		d := i * op.DstStride
		out = append(out, GetOp{RemoteKey: op.RemoteKey, RemoteAddr: op.RemoteAddr + uint64(i)*op.RemoteStride, Dst: op.Dst[d : d+op.Len : d+op.Len]})
	}
	return out
}

// Pieces is every piece of ops as GetOps, in order (AppendPieces).
func Pieces(ops []StridedOp) []GetOp {
	var out []GetOp
	for _, op := range ops {
		out = op.AppendPieces(out)
	}
	return out
}

// StridedProgressAtEnd is GetStridedProgress for a backend without
// Caps.Progress: get (its GetStrided), then one call of progress with every
// piece's bytes once they all landed.
func StridedProgressAtEnd(ctx context.Context, ops []StridedOp, progress func(n int), get func(context.Context, []StridedOp) error) error {
	err := get(ctx, ops)
	if err == nil && progress != nil {
		n := 0
		for _, op := range ops {
			n += op.Count * op.Len
		}
		progress(n)
	}
	return err
}
