package simengine

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/connex/connex/kvmem"
)

// loadReference is Load as it was before it visited only the words it
// checks: every position of every layer and plane, the unchecked ones
// skipped, the sampled head re-read by foldHeads. Load must give the same
// digest and the same first error for every input.
func loadReference(s *Sequence, n int) error {
	if s.kvDone != 0 {
		return fmt.Errorf("sim: load of %d positions into a sequence that already has KV", n)
	}
	if n > len(s.tokens) || n > s.Capacity() {
		return fmt.Errorf("sim: load of %d positions: %d tokens, blocks for %d", n, len(s.tokens), s.Capacity())
	}
	var d uint64
	for l := uint32(0); l < s.l.Layers; l++ {
		for k := uint32(0); k < 2; k++ {
			for p := 0; p < n; p++ {
				if !sampled(p) && p != n-1 {
					continue
				}
				all, head := p == n-1, s.sampledHead(p)
				for i := range s.ranks {
					g := &s.ranks[i]
					off := s.slotOff(g, p, l, k)
					for h := range g.n {
						if !all && g.first+h != head {
							continue
						}
						if w, want := s.first(g, k, off+g.base[k][h]), chunkSeed(s.hashes[p], l, k, g.first+h); w != want {
							what := "wrong KV (another block or another request's)"
							if w == 0 {
								what = "unwritten (zero) KV"
							}
							return fmt.Errorf("%w: %s at position %d, layer %d, plane %d, head %d (rank %d, local block %d)",
								ErrCorrupt, what, p, l, k, g.first+h, g.r.Layout.TPRank, s.blocks[p/int(s.l.BlockSize)])
						}
					}
				}
				if sampled(p) {
					s.foldHeads(&d, p, l, k)
				}
			}
		}
	}
	s.digest += d
	s.kvDone = n
	return nil
}

// loadBoth loads n positions of tokens from blocks of ranks with Load and
// with loadReference into fresh sequences and fails unless both give the
// same error (text) and the same digest.
func loadBoth(t *testing.T, what string, ranks []*kvmem.Region, blocks, tokens []uint32, n int) error {
	t.Helper()
	a, b := NewSequence(ranks, blocks, tokens), NewSequence(ranks, blocks, tokens)
	errA, errB := a.Load(n), loadReference(b, n)
	if fmt.Sprint(errA) != fmt.Sprint(errB) {
		t.Fatalf("%s: Load = %v, the reference loop %v", what, errA, errB)
	}
	if a.digest != b.digest || a.kvDone != b.kvDone {
		t.Fatalf("%s: Load's digest %#x (KV done %d), the reference loop's %#x (%d)", what, a.digest, a.kvDone, b.digest, b.kvDone)
	}
	return errA
}

// loadBlocks are the (unordered) blocks a load test's sequence uses.
func loadBlocks(bs, tokens int) []uint32 {
	out := []uint32{40, 3, 17, 9, 60, 22, 1, 5, 30, 31, 12, 50, 51, 52, 53, 54}
	return out[:(tokens+bs-1)/bs]
}

// TestSimLoadDigestMatchesReference: for every engine shape and load sizes
// around the sample stride (the last position sampled or not), Load's
// digest and answer are the reference loop's.
func TestSimLoadDigestMatchesReference(t *testing.T) {
	tokens := make([]uint32, 100)
	for i := range tokens {
		tokens[i] = uint32(i*7) % 256
	}
	for _, sh := range testShapes {
		ranks := layeredRegions(t, sh, 5)
		blocks := loadBlocks(int(ranks[0].Layout.BlockSize), len(tokens))
		if err := NewSequence(ranks, blocks, tokens).Compute(len(tokens)); err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{0, 1, 2, 15, 16, 17, 31, 32, 33, 48, 63, 65, 99, 100} {
			if err := loadBoth(t, fmt.Sprintf("shape %+v, %d positions", sh, n), ranks, blocks, tokens, n); err != nil {
				t.Fatalf("shape %+v, %d positions: intact KV rejected: %v", sh, n, err)
			}
		}
	}
}

// TestSimLoadChecksTheSameWords: one flipped bit in the first word of any
// head's K or V vector, at any position, layer, plane and rank, is found
// by Load exactly when the reference loop finds it (the sampled head of a
// sampled position, every head of the last position), with the same error
// naming that word; elsewhere it is not checked.
func TestSimLoadChecksTheSameWords(t *testing.T) {
	tokens := Encode("forty-odd bytes of prompt for the sweep....")
	for _, sh := range testShapes {
		ranks := layeredRegions(t, sh, 5)
		blocks := loadBlocks(int(ranks[0].Layout.BlockSize), len(tokens))
		if err := NewSequence(ranks, blocks, tokens).Compute(len(tokens)); err != nil {
			t.Fatal(err)
		}
		heads := ranks[0].Layout.Heads
		for _, n := range []int{33, 40} { // last position sampled (32), not (39)
			found := 0
			for p := range n + 1 {
				for l := range uint32(5) {
					for k := range uint32(2) {
						for _, r := range ranks {
							first, hn := r.Layout.HeadRange()
							for h := range hn {
								bs := int(r.Layout.BlockSize)
								plane, off := r.Layout.ElementAt(k, uint32(p%bs), h, 0)
								b := r.Block(l, plane, blocks[p/bs])
								b[off] ^= 1
								what := fmt.Sprintf("shape %+v, %d positions, bit flipped at position %d, layer %d, plane %d, head %d, rank %d", sh, n, p, l, k, first+h, r.Layout.TPRank)
								err := loadBoth(t, what, ranks, blocks, tokens, n)
								b[off] ^= 1
								checked := p < n && (p == n-1 || sampled(p) && first+h == uint32(p/sampleEvery)%heads)
								switch {
								case checked && !errors.Is(err, ErrCorrupt):
									t.Fatalf("%s: Load = %v, want ErrCorrupt", what, err)
								case checked && !strings.Contains(err.Error(), fmt.Sprintf("at position %d, layer %d, plane %d, head %d (rank %d,", p, l, k, first+h, r.Layout.TPRank)):
									t.Fatalf("%s: Load = %v, naming another word", what, err)
								case !checked && err != nil:
									t.Fatalf("%s: Load = %v, but that word is not checked", what, err)
								}
								if checked {
									found++
								}
							}
						}
					}
				}
			}
			if found == 0 {
				t.Fatalf("shape %+v, %d positions: no flipped bit was found", sh, n)
			}
		}
	}
}
