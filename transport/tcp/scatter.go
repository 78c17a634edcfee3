package tcp

import (
	"fmt"

	"github.com/connex/connex/transport"
)

// scatter says where a request's payload lands in its destination: all of
// it in a row (piece 0), or in pieces of piece bytes, stride apart — a
// strided op whose pieces lie back to back at the holder (a TP rank's heads
// of every token of a token-major block, read by a reader of another TP
// size) is read as one request per ChunkBytes instead of one per piece, and
// the reader scatters it as it arrives.
type scatter struct {
	n      int // payload bytes
	piece  int // 0: contiguous
	stride int
}

// at is the part of dst that payload offset off lands in, up to the end of
// its piece (or of dst).
func (s scatter) at(dst []byte, off int) []byte {
	if s.piece == 0 {
		return dst[off:s.n]
	}
	i, in := off/s.piece, off%s.piece
	start := i * s.stride
	return dst[start+in : start+s.piece]
}

// planStrided validates ops and plans them as chunks of at most limit
// payload bytes: an op whose pieces are back to back at the holder as
// scattered requests of whole pieces, one whose destination is contiguous
// too as a GetOp, any other as a request per piece.
func planStrided(ops []transport.StridedOp, limit int) ([]chunk, error) {
	var (
		chunks []chunk
		pieces []transport.GetOp
		owner  []int // pieces' op index
	)
	for i := range ops {
		op := &ops[i]
		if err := op.Check(); err != nil {
			return nil, fmt.Errorf("op %d: %w", i, err)
		}
		contiguousSrc := op.Count == 1 || op.RemoteStride == uint64(op.Len)
		switch {
		case !contiguousSrc || op.Len == 0:
			for range op.Count {
				owner = append(owner, i)
			}
			pieces = op.AppendPieces(pieces)
			continue
		case op.Count == 1 || op.DstStride == op.Len:
			n := op.Count * op.Len
			pieces = append(pieces, transport.GetOp{RemoteKey: op.RemoteKey, RemoteAddr: op.RemoteAddr, Dst: op.Dst[:n:n]})
			owner = append(owner, i)
			continue
		}
		key, err := decodeKey(op.RemoteKey)
		if err != nil {
			return nil, fmt.Errorf("op %d: %w", i, err)
		}
		per := max(1, limit/op.Len) // whole pieces per request
		for first := 0; first < op.Count; first += per {
			k := min(per, op.Count-first)
			start := first * op.DstStride
			end := (first+k-1)*op.DstStride + op.Len
			chunks = append(chunks, chunk{op: i, key: key, off: op.RemoteAddr + uint64(first*op.Len),
				dst: op.Dst[start:end:end], to: scatter{n: k * op.Len, piece: op.Len, stride: op.DstStride}})
		}
	}
	if len(pieces) > 0 {
		more, err := planChunks(pieces, limit)
		if err != nil {
			return nil, err
		}
		for j := range more {
			more[j].op = owner[more[j].op]
		}
		chunks = append(chunks, more...)
	}
	return chunks, nil
}
