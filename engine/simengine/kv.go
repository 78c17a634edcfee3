package simengine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"github.com/connex/connex/kvmem"
)

// ErrCorrupt means KV read from the region is not the KV of the sequence's
// tokens: a wrong block, another request's block, or an unwritten one.
var ErrCorrupt = errors.New("sim: corrupt KV")

const (
	phi       = 0x9e3779b97f4a7c15
	hashStart = 0x243f6a8885a308d3
)

// mix64 is splitmix64's finalizer: a cheap, well-spread bijection.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// prefixHash extends the prefix hash h (of the tokens before position p)
// with token tok at p.
func prefixHash(h uint64, tok uint32, p int) uint64 {
	return mix64(h ^ (uint64(tok)+1)*phi ^ uint64(p)<<32)
}

// chunkSeed is the first word of the KV of head head at the position with
// prefix hash h in layer l, plane k (K or V): never zero, so an unwritten
// block never verifies. It depends on the model's head, not on the rank
// that holds it, so the KV is the same whatever the engine's shape.
func chunkSeed(h uint64, l, k, head uint32) uint64 {
	return mix64(h+uint64(l*2+k+1)*0xd6e8feb86659fd93+uint64(head+1)*0xa0761d6478bd642f) | 1
}

// fold is what one chunk word adds to the digest.
func fold(w uint64, p int, l, k, head uint32) uint64 {
	return mix64(w ^ uint64(p)<<20 ^ uint64(l*2+k) ^ uint64(head)<<48)
}

// sampleEvery: the first position of every 16 has the first word of one
// head's K and V (head (p/16) mod heads: each in turn) folded into the
// digest and verified on load, and at position n-1 every head is verified
// (each head at least once in any load, and the last block). Reading one
// word of every position would touch every 4 KiB page of a 1 GiB load (40
// ms of page walks on the 2-core VM); one per 16 tokens, layer and plane
// costs a few ms and still catches a wrong, foreign or unwritten block, and
// a translation that misplaces a head (it misplaces it everywhere). A fixed
// stride, not the block size, and a head of the model, not of a rank, so
// that the digest — and the output — does not depend on the engine's
// shape.
const sampleEvery = 16

func sampled(p int) bool { return p%sampleEvery == 0 }

// Sequence is one request's tokens and their KV in an engine's regions
// (one per TP rank, each holding its heads): position p lives in block
// Blocks[p/block_size] of every rank.
type Sequence struct {
	ranks  []rankGeom
	l      kvmem.Layout // rank 0's
	e      uint64       // bytes of an element
	vec    int          // bytes of one head's K or V vector
	blocks []uint32
	tokens []uint32
	hashes []uint64 // prefix hash of every position
	digest uint64   // fold of every KV word read so far
	kvDone int      // positions [0, kvDone) are in the region and folded
	buf    []byte   // one vector, for layouts that scatter its elements
}

// rankGeom is where a rank's head vectors lie in a block: a head's vector
// at token slot s starts at base[k][h] + s×slotStride[k] in plane plane[k]
// (k: K or V), its elements dimStride[k] apart (the layout's in-block
// order, kvmem.Layout.ElementAt, is affine in the slot).
type rankGeom struct {
	r                     *kvmem.Region
	first, n              uint32 // the heads it holds
	primary               uint32 // its heads from first+primary on are held by no earlier rank: they count in the digest
	plane                 [2]uint32
	base                  [2][]uint64
	slotStride, dimStride [2]uint64
}

// NewSequence starts a sequence over tokens whose KV goes to blocks of the
// regions of every TP rank of an engine (ranks, by rank; enough blocks for
// every position that will have KV). The layouts must describe their
// blocks (LookupLayout's do).
func NewSequence(ranks []*kvmem.Region, blocks []uint32, tokens []uint32) *Sequence {
	l := ranks[0].Layout
	s := &Sequence{l: l, e: uint64(kvmem.DtypeBytes(l.Dtype)), vec: int(l.HeadSize * kvmem.DtypeBytes(l.Dtype)), blocks: blocks}
	s.buf = make([]byte, s.vec)
	seen := uint32(0)
	for _, r := range ranks {
		rl := r.Layout
		g := rankGeom{r: r}
		g.first, g.n = rl.HeadRange()
		g.primary = min(g.n, max(seen, g.first)-g.first)
		seen = max(seen, g.first+g.n)
		for k := uint32(0); k < 2; k++ {
			plane, o := rl.ElementAt(k, 0, 0, 0)
			g.plane[k] = plane
			if rl.BlockSize > 1 {
				_, o1 := rl.ElementAt(k, 1, 0, 0)
				g.slotStride[k] = o1 - o
			}
			g.dimStride[k] = s.e
			if rl.HeadSize > 1 {
				_, od := rl.ElementAt(k, 0, 0, 1)
				g.dimStride[k] = od - o
			}
			for h := range g.n {
				_, oh := rl.ElementAt(k, 0, h, 0)
				g.base[k] = append(g.base[k], oh)
			}
		}
		s.ranks = append(s.ranks, g)
	}
	for _, t := range tokens {
		s.push(t)
	}
	return s
}

func (s *Sequence) push(t uint32) {
	h := uint64(hashStart)
	if n := len(s.hashes); n > 0 {
		h = s.hashes[n-1]
	}
	s.hashes = append(s.hashes, prefixHash(h, t, len(s.tokens)))
	s.tokens = append(s.tokens, t)
}

// Len is the number of tokens.
func (s *Sequence) Len() int { return len(s.tokens) }

// Tokens are the sequence's tokens (not a copy).
func (s *Sequence) Tokens() []uint32 { return s.tokens }

// KVDone is the number of positions whose KV is in the region.
func (s *Sequence) KVDone() int { return s.kvDone }

// Capacity is how many positions the sequence's blocks hold.
func (s *Sequence) Capacity() int { return len(s.blocks) * int(s.l.BlockSize) }

// slotOff is where rank g's vectors of position p in layer l, K or V (k)
// begin: add base[k][h] for head h.
func (s *Sequence) slotOff(g *rankGeom, p int, l, k uint32) uint64 {
	bs := int(s.l.BlockSize)
	return g.r.Layout.Offset(l, g.plane[k], s.blocks[p/bs]) + uint64(p%bs)*g.slotStride[k]
}

// write fills the vector at off of rank g (K or V: k) with the words seed,
// seed+φ, ….
func (s *Sequence) write(g *rankGeom, k uint32, off, seed uint64) {
	mem := g.r.Bytes()
	if g.dimStride[k] == s.e {
		fill(mem[off:off+uint64(s.vec)], seed)
		return
	}
	fill(s.buf, seed)
	for d, at := uint64(0), off; d*s.e < uint64(s.vec); d, at = d+1, at+g.dimStride[k] {
		copy(mem[at:at+s.e], s.buf[d*s.e:(d+1)*s.e])
	}
}

// first is the first word (8 bytes) of the vector at off of rank g (K or
// V: k).
func (s *Sequence) first(g *rankGeom, k uint32, off uint64) uint64 {
	mem := g.r.Bytes()
	if g.dimStride[k] == s.e {
		return binary.LittleEndian.Uint64(mem[off:])
	}
	var w [8]byte
	for d, at := uint64(0), off; d*s.e < 8; d, at = d+1, at+g.dimStride[k] {
		copy(w[d*s.e:(d+1)*s.e], mem[at:at+s.e])
	}
	return binary.LittleEndian.Uint64(w[:])
}

// sampledHead is the head whose words position p (a sampled one) folds
// and verifies.
func (s *Sequence) sampledHead(p int) uint32 { return uint32(p/sampleEvery) % s.l.Heads }

// foldHeads adds the first word of the sampled head of position p (layer
// l, K or V: k) to d, read from the first rank that holds it.
func (s *Sequence) foldHeads(d *uint64, p int, l, k uint32) {
	head := s.sampledHead(p)
	for i := range s.ranks {
		g := &s.ranks[i]
		if head >= g.first+g.primary && head < g.first+g.n {
			*d += fold(s.first(g, k, s.slotOff(g, p, l, k)+g.base[k][head-g.first]), p, l, k, head)
			return
		}
	}
}

// Compute writes the KV of positions [KVDone, to) (a prefill, or the
// recomputation of a resume's generated tokens) in every rank and folds
// it, as read back from the regions, into the digest.
func (s *Sequence) Compute(to int) error {
	if to > len(s.tokens) || to > s.Capacity() {
		return fmt.Errorf("sim: compute KV up to position %d: %d tokens, blocks for %d", to, len(s.tokens), s.Capacity())
	}
	for l := uint32(0); l < s.l.Layers; l++ {
		for k := uint32(0); k < 2; k++ {
			for p := s.kvDone; p < to; p++ {
				for i := range s.ranks {
					g := &s.ranks[i]
					off := s.slotOff(g, p, l, k)
					for h := range g.n {
						s.write(g, k, off+g.base[k][h], chunkSeed(s.hashes[p], l, k, g.first+h))
					}
				}
				if sampled(p) {
					s.foldHeads(&s.digest, p, l, k)
				}
			}
		}
	}
	s.kvDone = max(s.kvDone, to)
	return nil
}

// Load accepts positions [0, n) as loaded into the regions by a pull:
// verifies the first word of the sampled head's K and V vectors at the
// sampled positions, and of every head's at position n-1, in every layer
// and every rank that holds them, against the tokens, and folds the
// sampled ones into the digest. A mismatch is ErrCorrupt naming the first
// bad head (in the order layer, plane, position, rank, head).
//
// It runs on a resume's critical path, so it visits only the words it
// checks (a few per 16 positions of a layer and plane), their offsets
// worked out once for all layers (loadChecks), in ascending address order
// when the blocks ascend.
func (s *Sequence) Load(n int) error {
	if s.kvDone != 0 {
		return fmt.Errorf("sim: load of %d positions into a sequence that already has KV", n)
	}
	if n > len(s.tokens) || n > s.Capacity() {
		return fmt.Errorf("sim: load of %d positions: %d tokens, blocks for %d", n, len(s.tokens), s.Capacity())
	}
	checks := s.loadChecks(n)
	plane := make([]uint64, len(s.ranks)) // where the layer and plane begin in each rank's region
	words := make([]uint64, len(checks))
	var d uint64
	for j := range 2 * s.l.Layers {
		l, k := j/2, j%2 // in address order: layer l's K, then its V
		for i := range s.ranks {
			g := &s.ranks[i]
			plane[i] = g.r.Layout.Offset(l, g.plane[k], 0)
		}
		s.gather(words, checks, plane, k)
		for i := range checks {
			c := &checks[i]
			g := &s.ranks[c.rank]
			w, want := words[i], chunkSeed(s.hashes[c.p], l, k, c.head)
			if w != want {
				what := "wrong KV (another block or another request's)"
				if w == 0 {
					what = "unwritten (zero) KV"
				}
				return fmt.Errorf("%w: %s at position %d, layer %d, plane %d, head %d (rank %d, local block %d)",
					ErrCorrupt, what, c.p, l, k, c.head, g.r.Layout.TPRank, s.blocks[c.p/int(s.l.BlockSize)])
			}
			if c.fold {
				// The word just checked is the one foldHeads reads: the
				// sampled head's, in the first rank that holds it.
				d += fold(w, c.p, l, k, c.head)
			}
		}
	}
	s.digest += d
	s.kvDone = n
	return nil
}

// gather reads the words of checks in a layer and plane K or V (k) that
// begins at plane[r] in rank r's region into words. A loop that does
// nothing but load keeps many cache and TLB misses in flight (each check
// is on another page): that, not the arithmetic, is Load's cost.
func (s *Sequence) gather(words []uint64, checks []loadCheck, plane []uint64, k uint32) {
	contiguous := true
	for i := range s.ranks {
		contiguous = contiguous && s.ranks[i].dimStride[k] == s.e
	}
	if !contiguous {
		for i := range checks {
			c := &checks[i]
			words[i] = s.first(&s.ranks[c.rank], k, plane[c.rank]+c.off[k])
		}
		return
	}
	if len(s.ranks) == 1 {
		mem, base := s.ranks[0].r.Bytes(), plane[0]
		for i := range checks {
			words[i] = binary.LittleEndian.Uint64(mem[base+checks[i].off[k]:])
		}
		return
	}
	for i := range checks {
		c := &checks[i]
		words[i] = binary.LittleEndian.Uint64(s.ranks[c.rank].r.Bytes()[plane[c.rank]+c.off[k]:])
	}
}

// loadCheck is one word Load verifies in every layer and plane: the first
// word of head head (the model's) at position p in rank rank (an index of
// Sequence.ranks), off[k] bytes past the start of that layer and plane K
// or V (k) in the rank's region; fold: it is the word foldHeads reads
// (the sampled head's, in the first rank whose own heads include it), so
// it counts in the digest.
type loadCheck struct {
	off  [2]uint64
	p    int
	rank int
	head uint32
	fold bool
}

// loadChecks are the words Load verifies in each layer and plane, in the
// order it reports the first bad one: the sampled positions and n-1,
// ascending; in each, the ranks in order and their heads in order (every
// head at n-1, the sampled one elsewhere).
func (s *Sequence) loadChecks(n int) []loadCheck {
	bs := int(s.l.BlockSize)
	out := make([]loadCheck, 0, (n/sampleEvery+1)*len(s.ranks)+int(s.l.Heads)*len(s.ranks))
	add := func(p int, g *rankGeom, i int, h uint32, fold bool) {
		c := loadCheck{p: p, rank: i, head: g.first + h, fold: fold}
		block := uint64(s.blocks[p/bs]) * g.r.Layout.BlockBytes
		for k := range c.off {
			c.off[k] = block + uint64(p%bs)*g.slotStride[k] + g.base[k][h]
		}
		out = append(out, c)
	}
	for p := 0; p < n; p += sampleEvery {
		if p == n-1 {
			break // checked with every head below
		}
		head, folded := s.sampledHead(p), false
		for i := range s.ranks {
			g := &s.ranks[i]
			if head >= g.first && head < g.first+g.n {
				f := !folded && head >= g.first+g.primary
				folded = folded || f
				add(p, g, i, head-g.first, f)
			}
		}
	}
	if p := n - 1; p >= 0 {
		head, folded := s.sampledHead(p), !sampled(p)
		for i := range s.ranks {
			g := &s.ranks[i]
			for h := range g.n {
				f := !folded && g.first+h == head && h >= g.primary
				folded = folded || f
				add(p, g, i, h, f)
			}
		}
	}
	return out
}

// Adopt folds positions [0, n) as read from the regions without checking
// them (for tests that show the output follows the KV actually present).
func (s *Sequence) Adopt(n int) {
	for l := uint32(0); l < s.l.Layers; l++ {
		for k := uint32(0); k < 2; k++ {
			for p := 0; p < n; p++ {
				if sampled(p) {
					s.foldHeads(&s.digest, p, l, k)
				}
			}
		}
	}
	s.kvDone = n
}

// Next is the next output token: a pure function of the digest of the KV
// read so far, the prefix hash of the tokens and the position. It needs
// the KV of every token (KVDone == Len).
func (s *Sequence) Next() uint32 {
	n := len(s.tokens)
	var h uint64 = hashStart
	if n > 0 {
		h = s.hashes[n-1]
	}
	return OutputBase + uint32(mix64(s.digest^h*phi^uint64(n))%uint64(VocabSize))
}

// Append adds a generated token and, if the blocks have room, writes its
// KV (the next step reads it).
func (s *Sequence) Append(t uint32) {
	s.push(t)
	if len(s.tokens) <= s.Capacity() && s.kvDone == len(s.tokens)-1 {
		_ = s.Compute(len(s.tokens))
	}
}

// fill writes the chunk's words seed, seed+φ, seed+2φ, … (little endian).
func fill(c []byte, seed uint64) {
	if len(c) >= 8 && uintptr(unsafe.Pointer(&c[0]))%8 == 0 {
		words := unsafe.Slice((*uint64)(unsafe.Pointer(&c[0])), len(c)/8)
		for i := range words {
			words[i] = seed
			seed += phi
		}
		return
	}
	for i := 0; i+8 <= len(c); i += 8 {
		binary.LittleEndian.PutUint64(c[i:], seed)
		seed += phi
	}
}
