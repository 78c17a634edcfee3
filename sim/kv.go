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

// chunkSeed is the first word of the KV of the position with prefix hash h
// in layer l, plane k: never zero, so an unwritten block never verifies.
func chunkSeed(h uint64, l, k uint32) uint64 {
	return mix64(h+uint64(l*2+k+1)*0xd6e8feb86659fd93) | 1
}

// fold is what one chunk word adds to the digest.
func fold(w uint64, p int, l, k uint32) uint64 {
	return mix64(w ^ uint64(p)<<20 ^ uint64(l*2+k))
}

// sampled reports whether position p's KV words are folded into the
// digest and verified on load: the first position of every block. Reading
// one word of every position would touch every 4 KiB page of a 1 GiB load
// (40 ms of page walks on the 2-core VM); one per block and layer-plane
// costs a few ms and still catches a wrong, foreign or unwritten block
// (blocks move whole; position n-1 is checked too, for the last block).
func (s *Sequence) sampled(p int) bool { return p%int(s.l.BlockSize) == 0 }

// Sequence is one request's tokens and their KV in an engine's region:
// position p lives in block Blocks[p/block_size].
type Sequence struct {
	region   *kvmem.Region
	l        kvmem.Layout
	tokBytes uint64
	blocks   []uint32
	tokens   []uint32
	hashes   []uint64 // prefix hash of every position
	digest   uint64   // fold of every KV word read so far
	kvDone   int      // positions [0, kvDone) are in the region and folded
}

// NewSequence starts a sequence over tokens whose KV goes to blocks of
// region (enough for every position that will have KV).
func NewSequence(region *kvmem.Region, blocks []uint32, tokens []uint32) *Sequence {
	l := region.Layout
	s := &Sequence{region: region, l: l, tokBytes: l.BlockBytes / uint64(l.BlockSize), blocks: blocks}
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

func (s *Sequence) chunk(p int, l, k uint32) []byte {
	b := s.blocks[p/int(s.l.BlockSize)]
	off := s.l.Offset(l, k, b) + uint64(p%int(s.l.BlockSize))*s.tokBytes
	return s.region.Bytes()[off : off+s.tokBytes : off+s.tokBytes]
}

// Compute writes the KV of positions [KVDone, to) (a prefill, or the
// recomputation of a resume's generated tokens) and folds it, as read back
// from the region, into the digest.
func (s *Sequence) Compute(to int) error {
	if to > len(s.tokens) || to > s.Capacity() {
		return fmt.Errorf("sim: compute KV up to position %d: %d tokens, blocks for %d", to, len(s.tokens), s.Capacity())
	}
	for l := uint32(0); l < s.l.Layers; l++ {
		for k := uint32(0); k < s.l.Planes; k++ {
			for p := s.kvDone; p < to; p++ {
				c := s.chunk(p, l, k)
				fill(c, chunkSeed(s.hashes[p], l, k))
				if s.sampled(p) {
					s.digest += fold(binary.LittleEndian.Uint64(c), p, l, k)
				}
			}
		}
	}
	s.kvDone = max(s.kvDone, to)
	return nil
}

// Load accepts positions [0, n) as loaded into the region by a pull:
// verifies the first word of the sampled positions' chunks (and of
// position n-1) in every layer and plane against the tokens and folds the
// sampled ones into the digest. A mismatch is ErrCorrupt naming
// the first bad chunk.
func (s *Sequence) Load(n int) error {
	if s.kvDone != 0 {
		return fmt.Errorf("sim: load of %d positions into a sequence that already has KV", n)
	}
	if n > len(s.tokens) || n > s.Capacity() {
		return fmt.Errorf("sim: load of %d positions: %d tokens, blocks for %d", n, len(s.tokens), s.Capacity())
	}
	var d uint64
	for l := uint32(0); l < s.l.Layers; l++ {
		for k := uint32(0); k < s.l.Planes; k++ {
			for p := 0; p < n; p++ {
				if !s.sampled(p) && p != n-1 {
					continue
				}
				w := binary.LittleEndian.Uint64(s.chunk(p, l, k))
				if want := chunkSeed(s.hashes[p], l, k); w != want {
					what := "wrong KV (another block or another request's)"
					if w == 0 {
						what = "unwritten (zero) KV"
					}
					return fmt.Errorf("%w: %s at position %d, layer %d, plane %d (local block %d)", ErrCorrupt, what, p, l, k, s.blocks[p/int(s.l.BlockSize)])
				}
				if s.sampled(p) {
					d += fold(w, p, l, k)
				}
			}
		}
	}
	s.digest += d
	s.kvDone = n
	return nil
}

// Adopt folds positions [0, n) as read from the region without checking
// them (for tests that show the output follows the KV actually present).
func (s *Sequence) Adopt(n int) {
	for l := uint32(0); l < s.l.Layers; l++ {
		for k := uint32(0); k < s.l.Planes; k++ {
			for p := 0; p < n; p++ {
				if !s.sampled(p) {
					continue
				}
				s.digest += fold(binary.LittleEndian.Uint64(s.chunk(p, l, k)), p, l, k)
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
