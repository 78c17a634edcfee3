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

// StreamPairUnfenced copies srcA to dstA and srcB to dstB, as
// StreamUnfenced(dstA, srcA) and StreamUnfenced(dstB, srcB) would, and
// returns the two byte counts; where the CPU has AVX2 it interleaves the
// two copies line by line. A copy of a lone 32 KiB piece spends a
// measurable share of its time waiting for its first lines from memory;
// two interleaved pieces overlap those waits, and scattered 32 KiB pieces
// copied in pairs ran 17–35% faster than one by one on the machines
// measured here (see doc.go). Neither destination may overlap the other
// or either source. End a run of copies with Fence.
func StreamPairUnfenced(dstA, srcA, dstB, srcB []byte) (int, int) {
	na, nb := min(len(dstA), len(srcA)), min(len(dstB), len(srcB))
	if na < streamMin || nb < streamMin || !haveStream {
		return StreamUnfenced(dstA, srcA), StreamUnfenced(dstB, srcB)
	}
	ha, hb := int(-uintptrOf(dstA)&63), int(-uintptrOf(dstB)&63)
	copy(dstA[:ha], srcA[:ha])
	copy(dstB[:hb], srcB[:hb])
	bodyA, bodyB := (na-ha)&^63, (nb-hb)&^63
	both := min(bodyA, bodyB) // > 0: na, nb >= streamMin
	raceCopy(dstA[ha:ha+both], srcA[ha:ha+both])
	raceCopy(dstB[hb:hb+both], srcB[hb:hb+both])
	streamPair(&dstA[ha], &srcA[ha], &dstB[hb], &srcB[hb], uintptr(both))
	if rest := bodyA - both; rest > 0 {
		raceCopy(dstA[ha+both:ha+bodyA], srcA[ha+both:ha+bodyA])
		streamLines(&dstA[ha+both], &srcA[ha+both], uintptr(rest))
	}
	if rest := bodyB - both; rest > 0 {
		raceCopy(dstB[hb+both:hb+bodyB], srcB[hb+both:hb+bodyB])
		streamLines(&dstB[hb+both], &srcB[hb+both], uintptr(rest))
	}
	copy(dstA[ha+bodyA:na], srcA[ha+bodyA:na])
	copy(dstB[hb+bodyB:nb], srcB[hb+bodyB:nb])
	return na, nb
}

// Fence makes the stores of every StreamUnfenced call before it on this
// thread globally visible before any later store. A goroutine may move to
// another thread between calls; the scheduler's locked instructions on the
// old thread then order its stores (on amd64 a locked instruction orders
// non-temporal stores as SFENCE does), so Fence at the end of a run of
// copies covers the whole run. Other goroutines still see the bytes only
// after synchronising with this one (a channel, a WaitGroup, a mutex).
func Fence() { fence() }
