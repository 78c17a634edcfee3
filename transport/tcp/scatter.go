package tcp

import (
	"fmt"
	"sync"
	"unsafe"

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
	parts  []part // a GATHER's ranges (gather.go); dst is then unused
}

// at is the part of dst that payload offset off lands in, up to the end of
// its piece (or of dst). Not for a GATHER: see iovAt.
func (s scatter) at(dst []byte, off int) []byte {
	if s.piece == 0 {
		return dst[off:s.n]
	}
	i, in := off/s.piece, off%s.piece
	start := i * s.stride
	return dst[start+in : start+s.piece]
}

// planStrided validates ops and plans them as chunks of at most limit
// payload bytes: ops whose pieces lie back to back at the holder as
// scattered requests of whole pieces — consecutive such ops that continue
// one another at both ends (the same head range of adjacent blocks) as one
// run —, one whose destination is contiguous too as a GetOp, any other as
// a request per piece.
func planStrided(ops []transport.StridedOp, limit int) ([]chunk, error) {
	var (
		chunks []chunk
		pieces []transport.GetOp
		owner  []int // pieces' op index
		run    scatterRun
	)
	flush := func() {
		chunks = run.appendChunks(chunks, limit)
		run = scatterRun{}
	}
	for i := range ops {
		op := &ops[i]
		if err := op.Check(); err != nil {
			return nil, fmt.Errorf("op %d: %w", i, err)
		}
		contiguousSrc := op.Count == 1 || op.RemoteStride == uint64(op.Len)
		if _, err := decodeKey(op.RemoteKey); err != nil {
			return nil, fmt.Errorf("op %d: %w", i, err)
		}
		switch {
		case !contiguousSrc || op.Len == 0 || op.Len > limit:
			// A request per piece (split where a piece is over limit:
			// the holder refuses requests over MaxRequestBytes).
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
		if run.extend(op) {
			continue
		}
		flush()
		key, _ := decodeKey(op.RemoteKey) // checked above
		span := (op.Count-1)*op.DstStride + op.Len
		run = scatterRun{op: i, rawKey: op.RemoteKey, key: key, addr: op.RemoteAddr, dst: op.Dst[:span:span], piece: op.Len, stride: op.DstStride, count: op.Count}
	}
	flush()
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

// scatterRun is consecutive strided ops read as one: count pieces back to
// back at the holder from addr, stride apart in dst from its start.
type scatterRun struct {
	op            int // the first op's index
	rawKey        []byte
	key           remoteKey
	addr          uint64
	dst           []byte // from the first piece to the last
	piece, stride int
	count         int
}

// extend adds op to the run if it continues it at both ends: the same key,
// piece and stride, its first piece right after the run's last at the
// holder, and its destination exactly where the run's next piece would go.
// The run's dst then spans both ops' destinations (pull hands each op a
// slice of one region's memory, capped to its own pieces): the reader
// writes only the pieces, each inside the destination of the op it came
// from, never the gaps between them.
func (r *scatterRun) extend(op *transport.StridedOp) bool {
	if r.count == 0 || op.Len != r.piece || op.DstStride != r.stride || string(op.RemoteKey) != string(r.rawKey) ||
		op.RemoteAddr != r.addr+uint64(r.count*r.piece) {
		return false
	}
	next := r.count * r.stride
	first := unsafe.SliceData(r.dst)
	if unsafe.SliceData(op.Dst) != (*byte)(unsafe.Add(unsafe.Pointer(first), next)) {
		return false
	}
	r.dst, r.count = unsafe.Slice(first, next+(op.Count-1)*op.DstStride+op.Len), r.count+op.Count
	return true
}

// appendChunks appends the run's requests, whole pieces of at most limit
// bytes each (at least one piece), to chunks.
func (r *scatterRun) appendChunks(chunks []chunk, limit int) []chunk {
	if r.count == 0 {
		return chunks
	}
	per := max(1, limit/r.piece)
	for first := 0; first < r.count; first += per {
		k := min(per, r.count-first)
		start, end := first*r.stride, (first+k-1)*r.stride+r.piece
		chunks = append(chunks, chunk{op: r.op, key: r.key, off: r.addr + uint64(first*r.piece),
			dst: r.dst[start:end:end], to: scatter{n: k * r.piece, piece: r.piece, stride: r.stride}})
	}
	return chunks
}

// scatterScratch is the most of a scattered payload a connection's reader
// holds at a time: it reads that much in as few reads as the socket allows
// (a piece at a time through the 4 KiB read buffer was a read(2) per
// 4 KiB), then copies it into its pieces. Scratches are pooled: a reader
// holds one only while it reads a scattered payload.
const scatterScratch = 256 << 10

var scratches = sync.Pool{New: func() any { b := make([]byte, scatterScratch); return &b }}

// copyInto copies src, the payload from offset off on, into its pieces of
// dst.
func (s scatter) copyInto(dst []byte, off int, src []byte) {
	for len(src) > 0 {
		k := copy(s.at(dst, off), src)
		src, off = src[k:], off+k
	}
}

// readScattered is readPayload for a scattered payload: read through a
// pooled scratch, then copied into r.dst's pieces. It returns the bytes
// consumed from br.
func (c *clientConn) readScattered(br *recvBuf, r *pendingReq) (int, error) {
	sp := scratches.Get().(*[]byte)
	defer scratches.Put(sp)
	scratch := *sp
	got := 0
	for got < r.to.n {
		buf := scratch[:min(len(scratch), r.to.n-got)]
		for read := 0; read < len(buf); {
			n, err := br.Read(buf[read:])
			read += n
			if err == nil {
				continue
			}
			c.mu.Lock()
			kick := c.rideKick(err)
			stop := r.abandoned
			c.mu.Unlock()
			if !kick {
				return got + read, err
			}
			if stop {
				return got + read, nil
			}
		}
		if faulted(func() { r.to.copyInto(r.dst, got, buf) }) {
			return got + len(buf), errDstFault
		}
		got += len(buf)
	}
	return got, nil
}
