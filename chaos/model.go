package chaos

import (
	"encoding/binary"
	"hash/crc64"

	"github.com/connex/connex/kvmem"
)

// The deterministic "engine" the harness plays: a request's KV content is a
// function of its id, and its output tokens are a function of the KV bytes
// the decode side actually holds. A pull that delivers wrong bytes, or a
// resume that recomputes differently, therefore changes the answer.

var crcTable = crc64.MakeTable(crc64.ECMA)

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// fillKV writes request seed's KV into blocks of r, every layer and plane.
func fillKV(r *kvmem.Region, blocks []uint32, seed uint64) {
	l := r.Layout
	var buf [8]byte
	for layer := uint32(0); layer < l.Layers; layer++ {
		for p := uint32(0); p < l.Planes; p++ {
			for i, b := range blocks {
				dst := r.Block(layer, p, b)
				x := splitmix(seed ^ uint64(layer)<<40 ^ uint64(p)<<32 ^ uint64(i))
				for off := 0; off+8 <= len(dst); off += 8 {
					x = splitmix(x)
					binary.LittleEndian.PutUint64(buf[:], x)
					copy(dst[off:], buf[:])
				}
			}
		}
	}
}

// checksum digests the KV of blocks of r in request order.
func checksum(r *kvmem.Region, blocks []uint32) uint64 {
	l := r.Layout
	h := crc64.New(crcTable)
	for layer := uint32(0); layer < l.Layers; layer++ {
		for p := uint32(0); p < l.Planes; p++ {
			for _, b := range blocks {
				_, _ = h.Write(r.Block(layer, p, b))
			}
		}
	}
	return h.Sum64()
}

// tokens is the deterministic output of a request whose KV digests to kv:
// tokens [from, to).
func tokens(kv uint64, from, to int) []uint32 {
	out := make([]uint32, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, uint32(splitmix(kv^uint64(i)*0x2545f4914f6cdd1d)))
	}
	return out
}

// prompt is request seed's prompt of n tokens.
func prompt(seed uint64, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(splitmix(seed+uint64(i))) % 128000
	}
	return out
}
