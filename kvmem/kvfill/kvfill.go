// Package kvfill writes and checks deterministic KV in a region laid out
// by a described kvmem.Layout, element by element: the value of every
// element depends only on (layer, K or V, token, model head, dim), never on
// the layout, so KV moved between engines of different TP sizes, block
// sizes or in-block orders can be verified head by head and token by token.
// For tests and benchmarks of pulls (kvmem, e2e); pure.
package kvfill

import (
	"fmt"

	"github.com/connex/connex/kvmem"
)

// Byte is byte j of the value of element (layer, kv, token, head, dim),
// head counted over the model (not the rank). Never zero, so an element
// that was not written never passes.
func Byte(layer, kv, tok, head, dim uint32, j int) byte {
	return byteOf(value(layer, kv, tok, head, dim), j)
}

// value is the 64-bit hash whose bytes an element's bytes are.
func value(layer, kv, tok, head, dim uint32) uint64 {
	x := uint64(layer)<<48 ^ uint64(kv)<<44 ^ uint64(tok)<<24 ^ uint64(head)<<12 ^ uint64(dim)
	x ^= x >> 31
	x *= 0x9e3779b97f4a7c15
	x ^= x >> 29
	return x
}

func byteOf(v uint64, j int) byte { return byte(v>>(8*(j%8))) | 1 }

// Fill writes every slot of blocks ids of mem, laid out as l (a rank's
// region): token i*BlockSize+s in slot s of ids[i], the rank's heads.
func Fill(l kvmem.Layout, mem []byte, ids []uint32) {
	each(l, ids, uint32(len(ids))*l.BlockSize, func(at uint64, layer, kv, tok, head, dim uint32, e int) bool {
		v := value(layer, kv, tok, head, dim)
		for j := range e {
			mem[at+uint64(j)] = byteOf(v, j)
		}
		return true
	})
}

// Check verifies that tokens [0, tokens) of mem, laid out as l, are in
// blocks ids (token t in slot t%BlockSize of ids[t/BlockSize]), element by
// element, for the rank's heads; and, when alone is set, that no other
// byte of mem was written (it started zeroed). The error names the first
// wrong element.
func Check(l kvmem.Layout, mem []byte, ids []uint32, tokens uint32, alone bool) error {
	var bad error
	want := 0
	each(l, ids, tokens, func(at uint64, layer, kv, tok, head, dim uint32, e int) bool {
		v := value(layer, kv, tok, head, dim)
		for j := range e {
			if got, w := mem[at+uint64(j)], byteOf(v, j); got != w {
				bad = fmt.Errorf("layer %d %s token %d head %d dim %d byte %d: got %#x, want %#x", layer, "KV"[kv:kv+1], tok, head, dim, j, got, w)
				return false
			}
		}
		want += e
		return true
	})
	if bad != nil || !alone {
		return bad
	}
	got := 0
	for _, c := range mem {
		if c != 0 {
			got++
		}
	}
	if got != want {
		return fmt.Errorf("%d bytes written, want %d: something outside the pull's tokens was written", got, want)
	}
	return nil
}

// each calls f for every element of tokens [0, tokens) of blocks ids of a
// rank laid out as l, with its byte offset in the region, until f says
// stop.
func each(l kvmem.Layout, ids []uint32, tokens uint32, f func(at uint64, layer, kv, tok, head, dim uint32, e int) bool) {
	e := int(kvmem.DtypeBytes(l.Dtype))
	h0, hn := l.HeadRange()
	for layer := uint32(0); layer < l.Layers; layer++ {
		for tok := uint32(0); tok < tokens; tok++ {
			b, s := ids[tok/l.BlockSize], tok%l.BlockSize
			for kv := uint32(0); kv < 2; kv++ {
				for h := uint32(0); h < hn; h++ {
					for d := uint32(0); d < l.HeadSize; d++ {
						p, off := l.ElementAt(kv, s, h, d)
						if !f(l.Offset(layer, p, b)+off, layer, kv, tok, h0+h, d, e) {
							return
						}
					}
				}
			}
		}
	}
}
