package memcopy

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestStreamCopiesEveryByte copies, with Stream and StreamUnfenced in
// turn, every length around the streaming
// threshold and around cache-line multiples, at every destination and source
// misalignment within a line, and checks every byte of the destination,
// including the guard bytes on both sides that must stay untouched.
func TestStreamCopiesEveryByte(t *testing.T) {
	for _, impl := range streamImpls() {
		t.Run(impl.name, func(t *testing.T) {
			defer impl.use()()
			testStreamCopiesEveryByte(t)
		})
	}
}

func testStreamCopiesEveryByte(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 1<<16+256)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	// Lengths whose streamed body is an odd and an even number of lines at
	// every alignment (the AVX2 loop copies two lines per iteration).
	lengths := []int{0, 1, 63, 64, 65, streamMin - 1, streamMin, streamMin + 1, streamMin + 64, streamMin + 128, 4095, 4096, 4097, 32 << 10, 32<<10 + 37, 1 << 16}
	dst := make([]byte, len(src)+256)
	for _, n := range lengths {
		for doff := 0; doff < 64; doff += 7 {
			for soff := 0; soff < 64; soff += 13 {
				for i := range dst {
					dst[i] = 0xEE
				}
				f, name := Stream, "Stream"
				if (n+doff+soff)%2 == 1 {
					f, name = StreamUnfenced, "StreamUnfenced"
				}
				got := f(dst[64+doff:64+doff+n], src[soff:soff+n])
				Fence()
				if got != n {
					t.Fatalf("%s n=%d doff=%d soff=%d: returned %d", name, n, doff, soff, got)
				}
				if !bytes.Equal(dst[64+doff:64+doff+n], src[soff:soff+n]) {
					t.Fatalf("%s n=%d doff=%d soff=%d: bytes differ", name, n, doff, soff)
				}
				for i, b := range dst[:64+doff] {
					if b != 0xEE {
						t.Fatalf("n=%d doff=%d soff=%d: guard byte %d before dst written", n, doff, soff, i)
					}
				}
				for i, b := range dst[64+doff+n:] {
					if b != 0xEE {
						t.Fatalf("n=%d doff=%d soff=%d: guard byte %d after dst written", n, doff, soff, i)
					}
				}
			}
		}
	}
}

// TestStreamPairCopiesEveryByte copies pairs of every combination of
// lengths (below and above the streaming threshold, equal and unequal, odd
// and even line counts) at several destination and source misalignments,
// with each streaming loop, and checks both destinations byte for byte,
// guard bytes included.
func TestStreamPairCopiesEveryByte(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	src := make([]byte, 2*(1<<16+256))
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	srcA, srcB := src[:len(src)/2], src[len(src)/2:]
	lengths := []int{0, 100, streamMin - 1, streamMin, streamMin + 64, 4097, 32 << 10, 32<<10 + 37, 1 << 16}
	dstA, dstB := make([]byte, len(srcA)+256), make([]byte, len(srcB)+256)
	for _, impl := range streamImpls() {
		t.Run(impl.name, func(t *testing.T) {
			defer impl.use()()
			for _, na := range lengths {
				for _, nb := range lengths {
					for off := 0; off < 64; off += 11 {
						da, db, sa, sb := off, (off*3)%64, (off*5)%64, (off*7)%64
						for i := range dstA {
							dstA[i], dstB[i] = 0xEE, 0xEE
						}
						ga, gb := StreamPairUnfenced(dstA[64+da:64+da+na], srcA[sa:sa+na], dstB[64+db:64+db+nb], srcB[sb:sb+nb])
						Fence()
						if ga != na || gb != nb {
							t.Fatalf("na=%d nb=%d off=%d: returned %d, %d", na, nb, off, ga, gb)
						}
						for _, c := range []struct {
							name     string
							dst, src []byte
							at, n    int
						}{{"A", dstA, srcA[sa : sa+na], 64 + da, na}, {"B", dstB, srcB[sb : sb+nb], 64 + db, nb}} {
							if !bytes.Equal(c.dst[c.at:c.at+c.n], c.src) {
								t.Fatalf("na=%d nb=%d off=%d: %s differs", na, nb, off, c.name)
							}
							if !allBytes(c.dst[:c.at], 0xEE) {
								t.Fatalf("na=%d nb=%d off=%d: %s guard before written", na, nb, off, c.name)
							}
							if !allBytes(c.dst[c.at+c.n:], 0xEE) {
								t.Fatalf("na=%d nb=%d off=%d: %s guard after written", na, nb, off, c.name)
							}
						}
					}
				}
			}
		})
	}
}

func allBytes(b []byte, v byte) bool {
	for _, x := range b {
		if x != v {
			return false
		}
	}
	return true
}

// TestStreamCopiesMinLength checks that Stream, like copy, copies the
// shorter of the two lengths.
func TestStreamCopiesMinLength(t *testing.T) {
	src := bytes.Repeat([]byte{7}, 5000)
	dst := make([]byte, 3000)
	if n := Stream(dst, src); n != 3000 || !bytes.Equal(dst, src[:3000]) {
		t.Fatalf("short dst: copied %d", n)
	}
	dst = make([]byte, 9000)
	if n := Stream(dst, src); n != 5000 || !bytes.Equal(dst[:5000], src) || dst[5000] != 0 {
		t.Fatalf("short src: copied %d", n)
	}
}

// BenchmarkPieces copies 128 MiB as 4096 scattered pieces of 32 KiB (the
// KV geometry of bench-pull) with copy, Stream, StreamUnfenced and
// StreamPairUnfenced (two pieces at a time, as mapped UCX reads copy), from
// sources larger than any cache, and reports GB/s; the ratios are printed
// by `go test -bench Pieces -v`.
func BenchmarkPieces(b *testing.B) {
	const piece, pieces = 32 << 10, 4096
	src := make([]byte, 2*piece*pieces)
	dst := make([]byte, 2*piece*pieces)
	for i := range src {
		src[i] = byte(i)
	}
	clear(dst)
	perm := rand.New(rand.NewPCG(3, 4)).Perm(2 * pieces)
	results := map[string]float64{}
	for _, c := range []struct {
		name string
		f    func(d, s []byte) int
	}{{"copy", func(d, s []byte) int { return copy(d, s) }}, {"stream", Stream}, {"unfenced", StreamUnfenced}, {"pairs", nil}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(piece * pieces)
			for b.Loop() {
				for i := range pieces {
					s, d := perm[i]*piece, perm[pieces+i]*piece
					if c.f != nil {
						c.f(dst[d:d+piece], src[s:s+piece])
						continue
					}
					if i%2 == 0 {
						s2, d2 := perm[i+1]*piece, perm[pieces+i+1]*piece
						StreamPairUnfenced(dst[d:d+piece], src[s:s+piece], dst[d2:d2+piece], src[s2:s2+piece])
					}
				}
				Fence()
			}
			results[c.name] = float64(piece*pieces) * float64(b.N) / b.Elapsed().Seconds() / 1e9
		})
	}
	if results["copy"] > 0 {
		b.Logf("%s", fmt.Sprintf("pieces GB/s copy=%.2f stream=%.2f unfenced=%.2f pairs=%.2f stream/copy=%.2f unfenced/stream=%.2f pairs/unfenced=%.2f",
			results["copy"], results["stream"], results["unfenced"], results["pairs"], results["stream"]/results["copy"], results["unfenced"]/results["stream"], results["pairs"]/results["unfenced"]))
	}
}
