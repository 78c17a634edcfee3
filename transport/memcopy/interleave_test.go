package memcopy

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestInterleave checks InterleaveUnfenced against a plain interleave, with
// every streaming loop this CPU runs: odd and even line counts (the AVX2
// loop writes two lines an iteration), guard bytes on both sides of dst
// untouched, and the refusals (another half, a misaligned dst, lengths
// that do not match) writing nothing.
func TestInterleave(t *testing.T) {
	for _, impl := range streamImpls() {
		t.Run(impl.name, func(t *testing.T) {
			defer impl.use()()
			r := rand.New(rand.NewPCG(5, 6))
			for _, lines := range []int{1, 2, 3, 4, 7, 128, 129} {
				n := 32 * lines
				a, b := make([]byte, n), make([]byte, n)
				for i := range a {
					a[i], b[i] = byte(r.Uint32()), byte(r.Uint32())
				}
				want := make([]byte, 0, 2*n)
				for i := 0; i < n; i += 32 {
					want = append(append(want, a[i:i+32]...), b[i:i+32]...)
				}
				buf := make([]byte, 2*n+256)
				off := int(-uintptrOf(buf)&63) + 64 // dst 64-byte aligned, guard bytes before it
				for i := range buf {
					buf[i] = 0xEE
				}
				dst := buf[off : off+2*n]
				if !InterleaveUnfenced(dst, a, b, 32) {
					if haveStream {
						t.Fatalf("%d lines: refused an aligned interleave", lines)
					}
					continue
				}
				Fence()
				if !bytes.Equal(dst, want) {
					t.Fatalf("%d lines: dst differs from the plain interleave", lines)
				}
				if !allByte(buf[:off], 0xEE) || !allByte(buf[off+2*n:], 0xEE) {
					t.Fatalf("%d lines: a guard byte was written", lines)
				}
				// Refusals write nothing.
				for i := range buf {
					buf[i] = 0xEE
				}
				for name, ok := range map[string]bool{
					"half 16":       InterleaveUnfenced(dst, a, b, 16),
					"misaligned":    InterleaveUnfenced(buf[off+8:off+8+2*n], a, b, 32),
					"short b":       InterleaveUnfenced(dst, a, b[:n-32], 32),
					"dst too short": InterleaveUnfenced(dst[:2*n-64], a, b, 32),
				} {
					if ok {
						t.Fatalf("%d lines: %s accepted", lines, name)
					}
				}
				if !allByte(buf, 0xEE) {
					t.Fatalf("%d lines: a refused interleave wrote", lines)
				}
			}
		})
	}
}

func allByte(b []byte, v byte) bool {
	for _, x := range b {
		if x != v {
			return false
		}
	}
	return true
}
