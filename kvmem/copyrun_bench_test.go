package kvmem

import "testing"

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
