package memcopy

import "golang.org/x/sys/cpu"

type streamImpl struct {
	name string
	use  func() (restore func())
}

// streamImpls lists the streaming loops this CPU can run: SSE2 always,
// AVX2 where the CPU has it.
func streamImpls() []streamImpl {
	set := func(avx2 bool) func() func() {
		return func() func() {
			old := useAVX2
			useAVX2 = avx2
			return func() { useAVX2 = old }
		}
	}
	impls := []streamImpl{{"sse2", set(false)}}
	if cpu.X86.HasAVX2 {
		impls = append(impls, streamImpl{"avx2", set(true)})
	}
	return impls
}
