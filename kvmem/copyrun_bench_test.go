package kvmem

import (
	"testing"

	"github.com/connex/connex/transport/memcopy"
)

// BenchmarkCopyOut measures a staged tile's regroup: the K runs of vLLM's
// CPU order between block sizes 16 and 32 (128 copies of 32 bytes each:
// a head's dimension row of 16 bfloat16 tokens) and its V runs (one copy
// of 4 KiB). SetBytes is the bytes copied.
func BenchmarkCopyOut(b *testing.B) {
	for _, c := range []struct {
		name string
		run  CopyRun
	}{
		{"k-32B", CopyRun{Len: 32, Count: 128, ScratchStride: 32, DstStride: 64}},
		{"v-4KiB", CopyRun{Len: 4096, Count: 1}},
		{"odd-24B", CopyRun{Len: 24, Count: 128, ScratchStride: 24, DstStride: 48}},
	} {
		b.Run(c.name, func(b *testing.B) {
			dst := make([]byte, 1<<16)
			scratch := make([]byte, 1<<16)
			b.SetBytes(int64(c.run.Len) * int64(c.run.Count))
			for b.Loop() {
				c.run.CopyOut(dst, 0, scratch)
			}
		})
	}
}

// BenchmarkRegroupTile measures one staged tile's regroup in the HETERO
// bench's shape (vLLM's CPU order, 8 KV heads of 128 bfloat16, blocks of
// 16 into 32: 128 KiB, every byte of one destination block): the copy
// runs one by one (StagedCopies, CopyOut), Regroup without a buffer (K
// runs paired: whole rows), and Regroup with one (the dense block
// assembled, then copied out, and streamed out as the puller does). The destination is
// 64 MiB, tiles taken in turn, so that its lines come from memory as a
// pull's do. SetBytes is the bytes copied.
func BenchmarkRegroupTile(b *testing.B) {
	layout := func(bs uint32) Layout {
		return Layout{Layers: 1, Planes: 1, Blocks: 512, BlockSize: bs, TPSize: 1, Order: OrderCPU, Heads: 8, HeadSize: 128, Dtype: "bfloat16",
			BlockBytes: 8 * 128 * 2 * uint64(bs) * 2}
	}
	tr, err := Translate(layout(16), layout(32))
	if err != nil {
		b.Fatal(err)
	}
	x, err := tr.ForPull([]uint32{0, 1}, []uint32{0}, 0)
	if err != nil {
		b.Fatal(err)
	}
	scratch := make([]byte, x.TileScratch(0))
	dst := make([]byte, tr.Dst.Size())
	clear(dst)
	buf := make([]byte, x.RegroupBytes())
	for _, c := range []struct {
		name string
		run  func()
	}{
		{"runs", func() { x.StagedCopies(0, 0, func(r CopyRun, do uint64) { r.CopyOut(dst, do, scratch) }) }},
		{"paired", func() { x.Regroup(0, 0, dst, scratch, nil, Out{}) }},
		{"dense", func() { x.Regroup(0, 0, dst, scratch, buf, Out{Copy: func(d, s []byte) { copy(d, s) }}) }},
		{"dense-stream", func() { x.Regroup(0, 0, dst, scratch, buf, Out{Copy: func(d, s []byte) { memcopy.Stream(d, s) }}) }},
		{"interleave-stream", func() {
			x.Regroup(0, 0, dst, scratch, buf, Out{Copy: func(d, s []byte) { memcopy.StreamUnfenced(d, s) }, Interleave: memcopy.InterleaveUnfenced})
			memcopy.Fence()
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(x.Bytes()))
			i := 0
			for b.Loop() {
				x.DstIDs[0] = uint32(i % int(tr.Dst.Blocks))
				c.run()
				i++
			}
		})
	}
}
