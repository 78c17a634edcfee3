package memcopy

// InterleaveUnfenced writes dst from a and b in turn, half bytes of each
// at a time — dst[2i·half:] holds a[i·half:(i+1)·half], then b's same
// bytes — with streaming stores and without a closing fence (end a run of
// copies with Fence), and reports whether it did. It does so where the
// platform streams, half is 32 (a row of a head's K in vLLM's CPU order at
// 16 tokens of bfloat16, two of which make one of 32 tokens), len(a) ==
// len(b) is a multiple of 32, len(dst) is twice that, dst is 32-byte
// aligned and none of the three overlap; else it writes nothing and
// returns false, and the caller interleaves some other way. Two 32-byte
// halves assembled in registers go out as one whole line: no line of dst
// is read into the cache, and no buffer stands between.
func InterleaveUnfenced(dst, a, b []byte, half int) bool {
	n := len(a)
	if !haveStream || half != 32 || n == 0 || n%32 != 0 || len(b) != n || len(dst) != 2*n || uintptrOf(dst)&31 != 0 {
		return false
	}
	raceCopy(dst[:n], a)
	raceCopy(dst[n:], b)
	interleave32(&dst[0], &a[0], &b[0], uintptr(n/32))
	return true
}
