package tcp

import "sort"

// GATHER (protocol version 2): one request reads up to MaxGatherSegments
// ranges of one registration, answered as one payload, their bytes in a
// row. A pull between engines of other shapes reads many small pieces (a
// TP rank's half of every block: 16 KiB each for Llama-3-8B's KV, or its
// heads of each token of a token-major block); as a request each, a piece
// costs both ends a request's handling, which on a 2-core machine is as
// much as its bytes (BENCHMARKS.md, HETERO). The reader lands a GATHER's
// payload with readv(2) straight into every piece of every range.

// part is one range of a GATHER: payload bytes [at, at+n) come from holder
// offset off and land in dst, all in a row (piece 0) or in pieces of piece
// bytes, stride apart (a scattered chunk: scatter.go).
type part struct {
	at, n         int
	off           uint64
	dst           []byte
	piece, stride int
}

// maxReadIov is the most destination slices one read of a payload fills:
// 512 KiB of a scattered range of 1 KiB pieces (UIO_MAXIOV is 1024).
const maxReadIov = 512

// iovAt appends to iov where payload offset off on lands: the rest of its
// piece (or of dst), and for a GATHER the pieces and parts after it, up to
// cap(iov).
func (s scatter) iovAt(dst []byte, off int, iov [][]byte) [][]byte {
	if s.parts == nil {
		return append(iov, s.at(dst, off))
	}
	i := sort.Search(len(s.parts), func(i int) bool { return s.parts[i].at+s.parts[i].n > off })
	for in := off - s.parts[i].at; i < len(s.parts) && len(iov) < cap(iov); i, in = i+1, 0 {
		iov = s.parts[i].appendIov(iov, in)
	}
	return iov
}

// appendIov appends p's destination from its payload offset in on, piece
// by piece, up to cap(iov).
func (p *part) appendIov(iov [][]byte, in int) [][]byte {
	if p.piece == 0 {
		return append(iov, p.dst[in:p.n])
	}
	for j := in / p.piece; j*p.piece < p.n && len(iov) < cap(iov); j++ {
		start := j*p.stride + max(0, in-j*p.piece)
		iov = append(iov, p.dst[start:j*p.stride+p.piece])
	}
	return iov
}

// segments is the wire form of a GATHER's parts.
func (s scatter) segments() []segment {
	segs := make([]segment, len(s.parts))
	for i, p := range s.parts {
		segs[i] = segment{offset: p.off, length: uint32(p.n)}
	}
	return segs
}

// Sizes of GATHERs. Only chunks of at most gatherPieceMax bytes are
// packed (a larger one costs its request's handling little beside its
// bytes), into requests of at most gatherBytes and MaxGatherSegments
// ranges, and small enough that a Get still has minRequests of them: a
// Get's requests are spread over the endpoint's connections and
// pipelined, which one large GATHER would undo (a 4 MiB GATHER of 64
// KiB pieces took the regroup of vLLM CPU blocks from 47 to 80 ms).
const (
	gatherPieceMax = 32 << 10
	gatherBytes    = 1 << 20
)

// gatherChunks packs planned chunks into GATHER requests (the sizes
// above, and at most maxBytes: Config.ChunkBytes; minRequests, the
// requests a Get wants in flight at once, bounds how large they grow), per
// registration: each registration's chunks in
// their order, the registrations in the order of their first chunk. Chunks
// it cannot pack (empty, large, alone in their request) are kept as they
// are.
func gatherChunks(chunks []chunk, maxBytes, minRequests int) []chunk {
	byKey := make(map[remoteKey][]int)
	var keys []remoteKey
	packable := 0
	for i := range chunks {
		c := &chunks[i]
		k := c.key
		if _, seen := byKey[k]; !seen {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], i)
		if packs(c) {
			packable += c.to.n
		}
	}
	limit := min(gatherBytes, maxBytes, max(1, packable/max(1, minRequests)))
	out := make([]chunk, 0, len(chunks))
	for _, k := range keys {
		var g chunk  // the GATHER being filled
		var from int // index in chunks of its first part
		flush := func() {
			switch len(g.to.parts) {
			case 0:
			case 1: // alone: as planned
				out = append(out, chunks[from])
			default:
				out = append(out, g)
			}
			g = chunk{}
		}
		for _, i := range byKey[k] {
			c := &chunks[i]
			if !packs(c) {
				out = append(out, *c)
				continue
			}
			if len(g.to.parts) == MaxGatherSegments || (len(g.to.parts) > 0 && g.to.n+c.to.n > limit) {
				flush()
			}
			if len(g.to.parts) == 0 {
				g, from = chunk{op: c.op, key: k, off: c.off}, i
			}
			g.to.parts = append(g.to.parts, part{at: g.to.n, n: c.to.n, off: c.off, dst: c.dst, piece: c.to.piece, stride: c.to.stride})
			g.to.n += c.to.n
		}
		flush()
	}
	return out
}

// packs reports whether c may be a GATHER's part.
func packs(c *chunk) bool {
	return c.to.parts == nil && c.to.n > 0 && c.to.n <= gatherPieceMax
}
