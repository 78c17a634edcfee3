package simengine

import (
	"fmt"

	"github.com/connex/connex/kvmem"
)

// Layout names a simulated model's KV geometry.
type Layout struct {
	Name      string
	Layers    uint32
	Heads     uint32 // KV heads of the model
	HeadSize  uint32 // elements per head vector
	Dtype     string // element type (kvmem.DtypeBytes)
	BlockSize uint32 // default tokens per block
	Blocks    uint32 // default block count
}

// TokenBytes is the model's KV of one token in one layer and plane (K or
// V), all heads together.
func (l Layout) TokenBytes() uint64 {
	return uint64(l.Heads) * uint64(l.HeadSize) * uint64(kvmem.DtypeBytes(l.Dtype))
}

// Layouts the simulator knows.
var Layouts = map[string]Layout{
	// small: the default for tests: 2 layers, 4 KV heads of 8 float16
	// elements (64 bytes per token per layer and plane), 16-token blocks
	// (1 KiB at TP 1), 512 blocks (8192 tokens, 2 MiB).
	"small": {Name: "small", Layers: 2, Heads: 4, HeadSize: 8, Dtype: "float16", BlockSize: 16, Blocks: 512},
	// llama3-8b: 32 layers, 8 KV heads of 128 bfloat16 elements (2 KiB per
	// token per layer and plane, 128 KiB of KV per token in all), 16-token
	// blocks (32 KiB at TP 1: an 8192-token prompt is 1 GiB); 1024 blocks
	// (16384 tokens, 2 GiB).
	"llama3-8b": {Name: "llama3-8b", Layers: 32, Heads: 8, HeadSize: 128, Dtype: "bfloat16", BlockSize: 16, Blocks: 1024},
}

// Shape is how an engine lays out a model's KV: its tensor-parallel size
// (one region per rank, each with its share of the heads), tokens per
// block and in-block order. Zero fields take the defaults: TP 1, the
// layout's block size, kvmem.OrderNHD.
type Shape struct {
	TP        uint32
	BlockSize uint32
	Order     string
}

// LookupLayout returns rank 0's layout of model name in an engine of shape
// with blocks blocks (0: the layout's default). The layout describes its
// blocks (heads, head size, dtype, order), so engines of different shapes
// exchange KV; its model is "sim-<name>".
func LookupLayout(name string, blocks uint32, shape Shape) (kvmem.Layout, error) {
	l, ok := Layouts[name]
	if !ok {
		return kvmem.Layout{}, fmt.Errorf("sim: unknown layout %q (known: small, llama3-8b)", name)
	}
	if blocks == 0 {
		blocks = l.Blocks
	}
	kl := kvmem.Layout{Layers: l.Layers, Planes: 2, Blocks: blocks, BlockSize: shape.BlockSize, TPSize: max(shape.TP, 1),
		Order: shape.Order, Heads: l.Heads, HeadSize: l.HeadSize, Dtype: l.Dtype, Model: "sim-" + l.Name}
	if kl.BlockSize == 0 {
		kl.BlockSize = l.BlockSize
	}
	if kl.Order == "" {
		kl.Order = kvmem.OrderNHD
	}
	if kl.Order == kvmem.OrderCPU {
		kl.Planes = 1
	}
	if kl.Heads%kl.TPSize != 0 && kl.TPSize%kl.Heads != 0 {
		return kvmem.Layout{}, fmt.Errorf("sim: layout %s has %d KV heads: tensor-parallel size %d must divide them or be a multiple of them", name, l.Heads, kl.TPSize)
	}
	_, n := kl.HeadRange()
	kl.BlockBytes = uint64(n) * uint64(l.HeadSize) * uint64(kvmem.DtypeBytes(l.Dtype)) * uint64(kl.BlockSize) * uint64(3-kl.Planes)
	return kl, kl.Validate()
}
