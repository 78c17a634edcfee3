package kvmem

import "fmt"

// In-block orders (Layout.Order): where each element of a block lies. A
// block holds, for each of BlockSize token slots and each of the rank's
// heads (HeadRange), a K and a V vector of HeadSize elements.
const (
	// OrderNHD is vLLM's GPU cache, (2, blocks, block_size, heads,
	// head_size) per layer: two planes (K, V), and in each a block is
	// [block_size][heads][head_size] (FlashAttention's default).
	OrderNHD = "nhd"
	// OrderHND is vLLM's VLLM_KV_CACHE_LAYOUT=HND: two planes, and in each
	// a block is [heads][block_size][head_size], so the tokens of one head
	// are contiguous (what NIXL asks for between different TP sizes).
	OrderHND = "hnd"
	// OrderCPU is vLLM's CPU backend, [blocks, heads, block_size,
	// 2*head_size] per layer: one plane, and in each block one page per
	// head, K transposed [head_size][block_size] then V
	// [block_size][head_size].
	OrderCPU = "cpu"
)

// maxModelName bounds Layout.Model.
const maxModelName = 256

// DtypeBytes is the size of one element of dtype, or 0 for a name this
// version does not know. The names are torch's (without "torch.") and
// vLLM's kv_cache_dtype for the 8-bit floats.
func DtypeBytes(dtype string) uint32 {
	switch dtype {
	case "float32":
		return 4
	case "float16", "bfloat16":
		return 2
	case "fp8_e4m3", "fp8_e5m2", "int8", "uint8":
		return 1
	}
	return 0
}

// Described reports whether l says what its blocks hold (heads, head size,
// dtype, order), which translation needs.
func (l Layout) Described() bool { return l.Order != "" }

// validateShape checks the description of what a block holds: all of it
// or none, consistent with the planes and bytes per block.
func (l Layout) validateShape() error {
	if !l.Described() {
		if l.Heads != 0 || l.HeadSize != 0 || l.Dtype != "" {
			return fmt.Errorf("%w: num_kv_heads, head_size and dtype describe a block only with its order (kv_order): give all four or none", ErrBadLayout)
		}
		return nil
	}
	wantPlanes := uint32(2)
	switch l.Order {
	case OrderNHD, OrderHND:
	case OrderCPU:
		wantPlanes = 1
	default:
		return fmt.Errorf("%w: kv_order=%q, allowed: %s, %s, %s", ErrBadLayout, l.Order, OrderNHD, OrderHND, OrderCPU)
	}
	e := DtypeBytes(l.Dtype)
	switch {
	case l.Planes != wantPlanes:
		return fmt.Errorf("%w: kv_order=%s keeps K and V in %d plane(s), kv_planes=%d", ErrBadLayout, l.Order, wantPlanes, l.Planes)
	case l.Heads == 0 || l.HeadSize == 0:
		return fmt.Errorf("%w: num_kv_heads and head_size must be > 0 in a described layout", ErrBadLayout)
	case e == 0:
		return fmt.Errorf("%w: dtype=%q, allowed: float32, float16, bfloat16, fp8_e4m3, fp8_e5m2, int8, uint8", ErrBadLayout, l.Dtype)
	case l.Heads%l.TPSize != 0 && l.TPSize%l.Heads != 0:
		return fmt.Errorf("%w: %d KV heads cannot be split over tp_size=%d (one must divide the other)", ErrBadLayout, l.Heads, l.TPSize)
	}
	_, n := l.HeadRange()
	want := uint64(n) * uint64(l.HeadSize) * uint64(e) * uint64(l.BlockSize) * uint64(3-l.Planes)
	if l.BlockBytes != want {
		return fmt.Errorf("%w: block_bytes=%d, but %d heads x head_size %d x %d-byte %s x block_size %d x %d (K, V) = %d",
			ErrBadLayout, l.BlockBytes, n, l.HeadSize, e, l.Dtype, l.BlockSize, 3-l.Planes, want)
	}
	return nil
}

// HeadRange is the KV heads rank TPRank holds: heads first .. first+n-1 of
// the model's Heads. As in vLLM, TPSize ranks split the heads evenly, or,
// with fewer heads than ranks, each rank holds one head, replicated on
// TPSize/Heads consecutive ranks. Only meaningful for a valid, described
// layout.
func (l Layout) HeadRange() (first, n uint32) {
	if l.Heads >= l.TPSize {
		n = l.Heads / l.TPSize
		return l.TPRank * n, n
	}
	return l.TPRank / (l.TPSize / l.Heads), 1
}

// rankOf is the first rank of a TPSize-way split of Heads that holds head h.
func (l Layout) rankOf(h uint32) uint32 {
	if l.Heads >= l.TPSize {
		return h / (l.Heads / l.TPSize)
	}
	return h * (l.TPSize / l.Heads)
}

// ElementAt is where element dim of the K (kv 0) or V (kv 1) vector of the
// rank's local head (0 .. n-1 of HeadRange) at token slot (0 .. BlockSize-1)
// lies: its plane, and its byte offset inside the block of that layer and
// plane. Only meaningful for a valid, described layout and arguments in
// range.
func (l Layout) ElementAt(kv, slot, head, dim uint32) (plane uint32, off uint64) {
	_, hn := l.HeadRange()
	bs, d := uint64(l.BlockSize), uint64(l.HeadSize)
	s, h, x := uint64(slot), uint64(head), uint64(dim)
	var idx uint64
	switch l.Order {
	case OrderNHD:
		plane, idx = kv, (s*uint64(hn)+h)*d+x
	case OrderHND:
		plane, idx = kv, (h*bs+s)*d+x
	default: // OrderCPU: one page per head, K transposed then V
		page := h * 2 * bs * d
		if kv == 0 {
			idx = page + x*bs + s
		} else {
			idx = page + bs*d + s*d + x
		}
	}
	return plane, idx * uint64(DtypeBytes(l.Dtype))
}

// dimsContiguous reports whether the elements of one K (kv 0) or V (kv 1)
// vector lie next to each other (not for the CPU order's transposed K).
func (l Layout) dimsContiguous(kv uint32) bool {
	return l.Order != OrderCPU || kv == 1 || l.HeadSize == 1 || l.BlockSize == 1
}
