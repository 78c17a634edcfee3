package memcopy

// streamMin is the smallest copy Stream streams; shorter copies gain nothing
// from bypassing the cache and go through copy.
const streamMin = 1024

// Stream copies min(len(dst), len(src)) bytes from src to dst, like copy,
// with stores that bypass the CPU cache where the platform has them, and
// returns the number of bytes copied. dst and src must not overlap. After
// Stream returns, the copied bytes are visible to other goroutines that
// synchronise with this one in the usual ways (the stores are fenced).
//
// Use it for bulk data that this CPU will not read soon; for data it will
// read next, copy is faster.
func Stream(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < streamMin || !haveStream {
		return copy(dst[:n], src[:n])
	}
	// Align the destination to a cache line, stream whole 64-byte lines,
	// copy the tail.
	head := int(-uintptrOf(dst) & 63)
	copy(dst[:head], src[:head])
	body := (n - head) &^ 63
	if body > 0 {
		streamLines(&dst[head], &src[head], uintptr(body))
	}
	copy(dst[head+body:n], src[head+body:n])
	return n
}
