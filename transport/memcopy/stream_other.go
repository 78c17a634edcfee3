//go:build !amd64

package memcopy

const haveStream = false

func streamLines(dst, src *byte, n uintptr) { panic("memcopy: streamLines without stream support") }

func streamPair(dstA, srcA, dstB, srcB *byte, n uintptr) {
	panic("memcopy: streamPair without stream support")
}

func interleave32(dst, a, b *byte, lines uintptr) {
	panic("memcopy: interleave32 without stream support")
}

func fence() {}

func uintptrOf(b []byte) uintptr { return 0 }
