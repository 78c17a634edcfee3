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
	n := StreamUnfenced(dst, src)
	fence()
	return n
}

// StreamUnfenced is Stream without the closing fence, for a run of copies
// that ends with one Fence: a fence waits until the write-combining
// buffers have drained to memory, which after every 32 KiB piece costs a
// measurable share of the bandwidth. Until Fence returns, other threads may
// see the copied bytes late or out of order.
func StreamUnfenced(dst, src []byte) int {
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
		raceCopy(dst[head:head+body], src[head:head+body])
		streamLines(&dst[head], &src[head], uintptr(body))
	}
	copy(dst[head+body:n], src[head+body:n])
	return n
}

// Fence makes the stores of every StreamUnfenced call before it on this
// thread globally visible before any later store. A goroutine may move to
// another thread between calls; the scheduler's locked instructions on the
// old thread then order its stores (on amd64 a locked instruction orders
// non-temporal stores as SFENCE does), so Fence at the end of a run of
// copies covers the whole run. Other goroutines still see the bytes only
// after synchronising with this one (a channel, a WaitGroup, a mutex).
func Fence() { fence() }
