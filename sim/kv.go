package sim

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

// sampleEvery: the first position of every 16 has its KV words folded
// into the digest and verified on load (and position n-1 is verified, for
// the last block). Reading one word of every position would touch every
// 4 KiB page of a 1 GiB load (40 ms of page walks on the 2-core VM); one
// per 16 tokens, head, layer and plane costs a few ms and still catches a
// wrong, foreign or unwritten block. A fixed stride, not the block size,
// so that the digest — and the output — does not depend on the engine's
// block size.
const sampleEvery = 16

func sampled(p int) bool { return p%sampleEvery == 0 }

// Sequence is one request's tokens and their KV in an engine's regions
// (one per TP rank, each holding its heads): position p lives in block
// Blocks[p/block_size] of every rank.
type Sequence struct {
	ranks  []*kvmem.Region
	l      kvmem.Layout // rank 0's
	vec    int          // bytes of one head's K or V vector
	blocks []uint32
	tokens []uint32
	hashes []uint64 // prefix hash of every position
	digest uint64   // fold of every KV word read so far
	kvDone int      // positions [0, kvDone) are in the region and folded
	buf    []byte   // one vector, for layouts that scatter its elements
}

// NewSequence starts a sequence over tokens whose KV goes to blocks of the
// regions of every TP rank of an engine (ranks, by rank; enough blocks for
// every position that will have KV). The layouts must describe their
// blocks (LookupLayout's do).
func NewSequence(ranks []*kvmem.Region, blocks []uint32, tokens []uint32) *Sequence {
	l := ranks[0].Layout
	s := &Sequence{ranks: ranks, l: l, vec: int(l.HeadSize * kvmem.DtypeBytes(l.Dtype)), blocks: blocks}
	s.buf = make([]byte, s.vec)
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

// heads calls f with every head of the model once, the rank region that
// holds it (the first, where heads are replicated) and its local index;
// with all set, every copy of it.
func (s *Sequence) heads(all bool, f func(r *kvmem.Region, local, head uint32)) {
	seen := uint32(0)
	for _, r := range s.ranks {
		first, n := r.Layout.HeadRange()
		for h := range n {
			if all || first+h >= seen {
				f(r, h, first+h)
			}
		}
		seen = max(seen, first+n)
	}
}

// vector is where head local's K (k 0) or V (k 1) vector of position p in
// layer l lies in region r: its first element, and the stride between
// elements (the element size where they are contiguous).
func (s *Sequence) vector(r *kvmem.Region, p int, l, k, local uint32) (off uint64, stride uint64) {
	b, slot := s.blocks[p/int(s.l.BlockSize)], uint32(p%int(s.l.BlockSize))
	plane, o := r.Layout.ElementAt(k, slot, local, 0)
	base := r.Layout.Offset(l, plane, b) + o
	if s.l.HeadSize > 1 {
		_, o1 := r.Layout.ElementAt(k, slot, local, 1)
		return base, o1 - o
	}
	return base, 0
}

// write fills head local's K or V vector of position p in layer l with the
// words seed, seed+φ, … and returns its first word as read back.
func (s *Sequence) write(r *kvmem.Region, p int, l, k, local uint32, seed uint64) uint64 {
	off, stride := s.vector(r, p, l, k, local)
	mem := r.Bytes()
	e := uint64(kvmem.DtypeBytes(s.l.Dtype))
	if stride == e {
		fill(mem[off:off+uint64(s.vec)], seed)
		return binary.LittleEndian.Uint64(mem[off:])
	}
	fill(s.buf, seed)
	for d := uint64(0); d*e < uint64(s.vec); d++ {
		copy(mem[off+d*stride:off+d*stride+e], s.buf[d*e:(d+1)*e])
	}
	return s.first(r, p, l, k, local)
}

// first is the first word (8 bytes) of head local's K or V vector of
// position p in layer l.
func (s *Sequence) first(r *kvmem.Region, p int, l, k, local uint32) uint64 {
	off, stride := s.vector(r, p, l, k, local)
	mem := r.Bytes()
	e := uint64(kvmem.DtypeBytes(s.l.Dtype))
	if stride == e {
		return binary.LittleEndian.Uint64(mem[off:])
	}
	var w [8]byte
	for d := uint64(0); d*e < 8; d++ {
		copy(w[d*e:(d+1)*e], mem[off+d*stride:off+d*stride+e])
	}
	return binary.LittleEndian.Uint64(w[:])
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
				s.heads(true, func(r *kvmem.Region, local, head uint32) {
					s.write(r, p, l, k, local, chunkSeed(s.hashes[p], l, k, head))
				})
				if sampled(p) {
					s.heads(false, func(r *kvmem.Region, local, head uint32) {
						s.digest += fold(s.first(r, p, l, k, local), p, l, k, head)
					})
				}
			}
		}
	}
	s.kvDone = max(s.kvDone, to)
	return nil
}

// Load accepts positions [0, n) as loaded into the regions by a pull:
// verifies the first word of every head's K and V vectors at the sampled
// positions (and position n-1), in every layer and every rank, against the
// tokens, and folds the sampled ones into the digest. A mismatch is
// ErrCorrupt naming the first bad head.
func (s *Sequence) Load(n int) error {
	if s.kvDone != 0 {
		return fmt.Errorf("sim: load of %d positions into a sequence that already has KV", n)
	}
	if n > len(s.tokens) || n > s.Capacity() {
		return fmt.Errorf("sim: load of %d positions: %d tokens, blocks for %d", n, len(s.tokens), s.Capacity())
	}
	var d uint64
	var bad error
	for l := uint32(0); l < s.l.Layers && bad == nil; l++ {
		for k := uint32(0); k < 2 && bad == nil; k++ {
			for p := 0; p < n && bad == nil; p++ {
				if !sampled(p) && p != n-1 {
					continue
				}
				s.heads(true, func(r *kvmem.Region, local, head uint32) {
					if bad != nil {
						return
					}
					if w, want := s.first(r, p, l, k, local), chunkSeed(s.hashes[p], l, k, head); w != want {
						what := "wrong KV (another block or another request's)"
						if w == 0 {
							what = "unwritten (zero) KV"
						}
						bad = fmt.Errorf("%w: %s at position %d, layer %d, plane %d, head %d (rank %d, local block %d)", ErrCorrupt, what, p, l, k, head, r.Layout.TPRank, s.blocks[p/int(s.l.BlockSize)])
					}
				})
				if sampled(p) {
					s.heads(false, func(r *kvmem.Region, local, head uint32) {
						d += fold(s.first(r, p, l, k, local), p, l, k, head)
					})
				}
			}
		}
	}
	if bad != nil {
		return bad
	}
	s.digest += d
	s.kvDone = n
	return nil
}

// Adopt folds positions [0, n) as read from the regions without checking
// them (for tests that show the output follows the KV actually present).
func (s *Sequence) Adopt(n int) {
	for l := uint32(0); l < s.l.Layers; l++ {
		for k := uint32(0); k < 2; k++ {
			for p := 0; p < n; p++ {
				if sampled(p) {
					s.heads(false, func(r *kvmem.Region, local, head uint32) {
						s.digest += fold(s.first(r, p, l, k, local), p, l, k, head)
					})
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
