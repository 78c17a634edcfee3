package sim

import (
	"fmt"

	"github.com/connex/connex/kvmem"
)

// Layout names a KV geometry.
type Layout struct {
	Name       string
	Layers     uint32
	TokenBytes uint64 // bytes of KV per token per layer and plane
	BlockSize  uint32 // tokens per block
	Blocks     uint32 // default block count
}

// Layouts the simulator knows.
var Layouts = map[string]Layout{
	// small: the default for tests: 2 layers, K and V, 16-token blocks, 64
	// bytes per token per layer-plane (1 KiB blocks), 512 blocks (8192
	// tokens, 2 MiB).
	"small": {Name: "small", Layers: 2, TokenBytes: 64, BlockSize: 16, Blocks: 512},
	// llama3-8b: 32 layers, K and V, 16-token blocks, 2 KiB per token per
	// layer-plane (128 KiB of KV per token in all, 32 KiB blocks: an
	// 8192-token prompt is 1 GiB); 1024 blocks (16384 tokens, 2 GiB).
	"llama3-8b": {Name: "llama3-8b", Layers: 32, TokenBytes: 2048, BlockSize: 16, Blocks: 1024},
}

// LookupLayout returns the layout named name with blocks blocks (0: the
// layout's default).
func LookupLayout(name string, blocks uint32) (kvmem.Layout, error) {
	l, ok := Layouts[name]
	if !ok {
		return kvmem.Layout{}, fmt.Errorf("sim: unknown layout %q (known: small, llama3-8b)", name)
	}
	if blocks == 0 {
		blocks = l.Blocks
	}
	kl := kvmem.Layout{Layers: l.Layers, Planes: 2, Blocks: blocks, BlockBytes: l.TokenBytes * uint64(l.BlockSize), BlockSize: l.BlockSize, TPSize: 1}
	return kl, kl.Validate()
}
