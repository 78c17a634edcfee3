package kvmem

import (
	"errors"
	"fmt"
	"sort"
)

// ErrBadLayout is returned for a layout that cannot describe a KV region.
var ErrBadLayout = errors.New("kvmem: bad layout")

// ErrIncompatible is returned when two layouts cannot exchange blocks.
var ErrIncompatible = errors.New("kvmem: incompatible layouts")

// MaxRegionBytes bounds one region (1 TiB) so that arithmetic on offsets can
// never overflow and a typo in a layout fails loudly.
const MaxRegionBytes = 1 << 40

// MaxBlocks bounds the blocks of one region (4 Mi): connexd keeps a few
// bytes of accounting per block, and no engine needs more.
const MaxBlocks = 1 << 22

// MaxLayers bounds a region's layers (or cache groups' layers): a hold
// keeps an extent per layer, plane and run of blocks.
const MaxLayers = 4096

// MaxExtents bounds the extents one hold or pull describes (layers ×
// planes × runs of consecutive block ids; 16 bytes each while connexd
// plans and registers them), so that no engine's request makes connexd
// allocate without bound: 4 Mi, e.g. 8192 scattered blocks of a
// 256-layer-plane model 2 times over.
const MaxExtents = 1 << 22

// Layout is the geometry of a KV region: layers × planes × blocks × bytes,
// laid out layer-major. Block b of plane p of layer l starts at
// ((l*Planes+p)*Blocks+b)*BlockBytes. Planes is 2 when K and V are separate
// planes (plane 0 = K, 1 = V: vLLM's GPU attention backends) and 1 when K
// and V share each block (vLLM's CPU backend keeps a layer as [blocks,
// kv_heads, block_size, 2*head_size]); either way a block moves whole
// between regions of the same shape.
//
// A layout that also describes what its blocks hold (Order, Heads,
// HeadSize, Dtype: shape.go) can be translated into another one of the same
// model with another TP size, TP rank, block size or in-block order
// (Translate, translate.go); one that does not moves only whole blocks
// between equal shapes. A tensor-parallel engine has one region per rank,
// each with its own layout (TPRank), all of the same shape otherwise.
type Layout struct {
	Layers     uint32 // transformer layers in this region
	Planes     uint32 // 2: K and V planes; 1: K and V inside each block
	Blocks     uint32 // blocks per layer and plane
	BlockBytes uint64 // bytes of one block in one layer and plane
	BlockSize  uint32 // tokens per block
	TPSize     uint32 // tensor-parallel size of the owning engine
	TPRank     uint32 // this region's tensor-parallel rank, < TPSize

	// What a block holds (all zero: not described). Described, the KV of a
	// rank is its share of Heads (HeadRange) for every token of a block,
	// in Order.
	Order    string // in-block order: OrderNHD, OrderHND or OrderCPU (shape.go)
	Heads    uint32 // KV heads of the model, all ranks together (num_kv_heads)
	HeadSize uint32 // elements of one head's K (or V) vector (head_size)
	Dtype    string // element type (Dtypes): float16, bfloat16, float32, fp8_e4m3, fp8_e5m2, int8, uint8
	// Model names the model the KV belongs to ("": unnamed); two named
	// layouts of different models never exchange KV.
	Model string
}

// Validate reports why l cannot describe a region, or nil.
func (l Layout) Validate() error {
	switch {
	case l.Layers == 0 || l.Layers > MaxLayers:
		return fmt.Errorf("%w: num_layers=%d, allowed: 1..%d", ErrBadLayout, l.Layers, MaxLayers)
	case l.Planes != 1 && l.Planes != 2:
		return fmt.Errorf("%w: kv_planes=%d, want 2 (K and V planes) or 1 (K and V inside each block); only full-attention KV is supported", ErrBadLayout, l.Planes)
	case l.Blocks == 0 || l.Blocks > MaxBlocks:
		return fmt.Errorf("%w: num_blocks=%d, allowed: 1..%d", ErrBadLayout, l.Blocks, MaxBlocks)
	case l.BlockBytes == 0:
		return fmt.Errorf("%w: block_bytes must be > 0", ErrBadLayout)
	case l.BlockSize == 0:
		return fmt.Errorf("%w: block_size must be > 0", ErrBadLayout)
	case l.TPSize == 0:
		return fmt.Errorf("%w: tp_size must be > 0", ErrBadLayout)
	case l.TPRank >= l.TPSize:
		return fmt.Errorf("%w: tp_rank=%d, want < tp_size=%d", ErrBadLayout, l.TPRank, l.TPSize)
	case len(l.Model) > maxModelName:
		return fmt.Errorf("%w: model name of %d bytes, at most %d", ErrBadLayout, len(l.Model), maxModelName)
	}
	if err := l.validateShape(); err != nil {
		return err
	}
	total := uint64(l.Layers) * uint64(l.Planes)
	if total > MaxRegionBytes/uint64(l.Blocks) || total*uint64(l.Blocks) > MaxRegionBytes/l.BlockBytes {
		return fmt.Errorf("%w: region larger than %d bytes", ErrBadLayout, uint64(MaxRegionBytes))
	}
	return nil
}

// Size is the number of bytes of a region with this layout. Only meaningful
// for a valid layout.
func (l Layout) Size() uint64 {
	return uint64(l.Layers) * uint64(l.Planes) * uint64(l.Blocks) * l.BlockBytes
}

// Offset is the byte offset of block b of plane p of layer layer.
func (l Layout) Offset(layer, plane, b uint32) uint64 {
	return ((uint64(layer)*uint64(l.Planes)+uint64(plane))*uint64(l.Blocks) + uint64(b)) * l.BlockBytes
}

// Run is a maximal range of consecutive block ids: First, First+1, …,
// First+Count-1, starting at index Index of the list it came from.
type Run struct {
	Index int    // position of First in the original id list
	First uint32 // first block id
	Count uint32 // number of blocks
}

// Runs splits ids, in their given order, into runs of consecutive ids.
func Runs(ids []uint32) []Run {
	var out []Run
	for i, id := range ids {
		if n := len(out); n > 0 && out[n-1].First+out[n-1].Count == id && out[n-1].Index+int(out[n-1].Count) == i {
			out[n-1].Count++
			continue
		}
		out = append(out, Run{Index: i, First: id, Count: 1})
	}
	return out
}

// Extent is a contiguous byte range of a region.
type Extent struct {
	Off uint64
	Len uint64
}

// Extents returns the contiguous byte ranges that hold the given blocks in
// every layer and plane, ordered layer-major, then plane, then run (runs in
// the order of ids). This order is the wire order of a hold's segments.
func (l Layout) Extents(ids []uint32) []Extent {
	runs := Runs(ids)
	out := make([]Extent, 0, int(l.Layers)*int(l.Planes)*len(runs))
	for layer := uint32(0); layer < l.Layers; layer++ {
		for p := uint32(0); p < l.Planes; p++ {
			for _, r := range runs {
				out = append(out, Extent{Off: l.Offset(layer, p, r.First), Len: uint64(r.Count) * l.BlockBytes})
			}
		}
	}
	return out
}

// CheckExtents refuses a block id list whose blocks this layout keeps in
// more than MaxExtents extents (see Extents), before anything is
// allocated for them.
func (l Layout) CheckExtents(ids []uint32) error {
	runs := 0
	for i, id := range ids {
		if i == 0 || ids[i-1]+1 != id {
			runs++
		}
	}
	if n := uint64(l.Layers) * uint64(l.Planes) * uint64(runs); n > MaxExtents {
		return fmt.Errorf("%w: %d blocks in %d runs of consecutive ids make %d extents over %d layers and %d planes, at most %d: fewer or more contiguous blocks",
			ErrBadBlockIDs, len(ids), runs, n, l.Layers, l.Planes, MaxExtents)
	}
	return nil
}

// ErrBadBlockIDs is returned for an empty, out-of-range or duplicated block id list.
var ErrBadBlockIDs = errors.New("kvmem: bad block ids")

// MaxBlockIDs bounds a block id list in one request.
const MaxBlockIDs = 1 << 20

// ValidateBlockIDs checks that ids is non-empty, within [0, blocks) and free
// of duplicates.
func ValidateBlockIDs(ids []uint32, blocks uint32) error {
	if len(ids) == 0 {
		return fmt.Errorf("%w: empty list", ErrBadBlockIDs)
	}
	if len(ids) > MaxBlockIDs || len(ids) > int(blocks) {
		return fmt.Errorf("%w: %d ids for a region of %d blocks", ErrBadBlockIDs, len(ids), blocks)
	}
	sorted := append([]uint32(nil), ids...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	for i, id := range sorted {
		if id >= blocks {
			return fmt.Errorf("%w: id %d out of range [0,%d)", ErrBadBlockIDs, id, blocks)
		}
		if i > 0 && sorted[i-1] == id {
			return fmt.Errorf("%w: id %d listed twice", ErrBadBlockIDs, id)
		}
	}
	return nil
}
