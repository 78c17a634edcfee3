package kvmem

// The copies of a staged tile's runs (CopyRun): from the tile's scratch,
// or from views of the holder's memory (regroupfrom.go). Each takes the
// bytes its run reads from and where in them the run's first copy starts.

// CopyOut performs run into dst (the destination region) at dstOff, from
// scratch (the tile's).
func (r CopyRun) CopyOut(dst []byte, dstOff uint64, scratch []byte) {
	copyRun(r, scratch, r.Scratch, dst, dstOff)
}

// copyRun performs run r into dst at d, its copy i from src at s +
// i×ScratchStride.
func copyRun(r CopyRun, src []byte, s uint64, dst []byte, d uint64) {
	n := r.Len
	// The pieces of a staged tile are small (a row of a head's K in vLLM's
	// CPU order: block_size elements, 32 bytes of bfloat16 at 16 tokens),
	// so a copy call's own cost would be most of the regroup: pieces of 8,
	// 16, 32 and 64 bytes are moved as arrays (a few vector moves each).
	switch n {
	case 8:
		for range r.Count {
			v := *(*[8]byte)(src[s:]) // through a value: a copy between two slices is a memmove call
			*(*[8]byte)(dst[d:]) = v
			s, d = s+r.ScratchStride, d+r.DstStride
		}
	case 16:
		for range r.Count {
			v := *(*[16]byte)(src[s:]) // through a value: a copy between two slices is a memmove call
			*(*[16]byte)(dst[d:]) = v
			s, d = s+r.ScratchStride, d+r.DstStride
		}
	case 32:
		for range r.Count {
			v := *(*[32]byte)(src[s:]) // through a value: a copy between two slices is a memmove call
			*(*[32]byte)(dst[d:]) = v
			s, d = s+r.ScratchStride, d+r.DstStride
		}
	case 64:
		for range r.Count {
			v := *(*[64]byte)(src[s:]) // through a value: a copy between two slices is a memmove call
			*(*[64]byte)(dst[d:]) = v
			s, d = s+r.ScratchStride, d+r.DstStride
		}
	default:
		for range r.Count {
			copy(dst[d:d+n], src[s:s+n])
			s, d = s+r.ScratchStride, d+r.DstStride
		}
	}
}

// copyPair performs run r and the run that fills its gaps (the same but
// for where its bytes are, src2 at s2, and its place in the destination,
// right after r's), copy i of each in turn, into dst at d: r's copy i
// from src at s + i×ScratchStride, the other's from src2 at s2 +
// i×ScratchStride.
func copyPair(r CopyRun, src []byte, s uint64, src2 []byte, s2 uint64, dst []byte, d uint64) {
	n := r.Len
	switch n {
	case 16:
		for range r.Count {
			a, b := *(*[16]byte)(src[s:]), *(*[16]byte)(src2[s2:]) // through values: a copy between two slices is a memmove call
			o := (*[32]byte)(dst[d:])
			*(*[16]byte)(o[:16]) = a
			*(*[16]byte)(o[16:]) = b
			s, s2, d = s+r.ScratchStride, s2+r.ScratchStride, d+r.DstStride
		}
	case 32:
		for range r.Count {
			a, b := *(*[32]byte)(src[s:]), *(*[32]byte)(src2[s2:])
			o := (*[64]byte)(dst[d:])
			*(*[32]byte)(o[:32]) = a
			*(*[32]byte)(o[32:]) = b
			s, s2, d = s+r.ScratchStride, s2+r.ScratchStride, d+r.DstStride
		}
	default:
		for range r.Count {
			copy(dst[d:d+n], src[s:s+n])
			copy(dst[d+n:d+2*n], src2[s2:s2+n])
			s, s2, d = s+r.ScratchStride, s2+r.ScratchStride, d+r.DstStride
		}
	}
}
