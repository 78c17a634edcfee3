package simengine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/regionfile"
)

func testRegion(t testing.TB, layout string, blocks uint32) *kvmem.Region {
	t.Helper()
	l, err := LookupLayout(layout, blocks, Shape{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := regionfile.CreateMemfd("sim-test", l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func one(r *kvmem.Region) []*kvmem.Region { return []*kvmem.Region{r} }

func seqIDs(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// generate prefills tokens into blocks and returns n output tokens.
func generate(t testing.TB, r *kvmem.Region, blocks []uint32, prompt []uint32, n int) []uint32 {
	t.Helper()
	return generateOn(t, one(r), blocks, prompt, n)
}

// generateOn prefills prompt into blocks of an engine's rank regions and
// returns n output tokens.
func generateOn(t testing.TB, ranks []*kvmem.Region, blocks []uint32, prompt []uint32, n int) []uint32 {
	t.Helper()
	s := NewSequence(ranks, blocks, prompt)
	if err := s.Compute(len(prompt)); err != nil {
		t.Fatal(err)
	}
	var out []uint32
	for range n {
		tok := s.Next()
		out = append(out, tok)
		s.Append(tok)
	}
	return out
}

func TestSimTokenizerRoundTrip(t *testing.T) {
	for _, s := range []string{"", "hello", "héllo wörld ✓", "<|user|>\nx\n"} {
		got, err := Decode(Encode(s))
		if err != nil || got != s {
			t.Fatalf("Decode(Encode(%q)) = %q, %v", s, got, err)
		}
	}
	ids := []uint32{OutputBase, OutputBase + 1, MaxTokenID()}
	text, err := Decode(ids)
	if err != nil {
		t.Fatal(err)
	}
	var cat string
	for _, id := range ids {
		cat += TokenText(id)
	}
	if text != cat || text != Vocab[0]+Vocab[1]+Vocab[VocabSize-1] {
		t.Fatalf("sequence text %q, concatenated token texts %q", text, cat)
	}
	if _, err := Decode([]uint32{MaxTokenID() + 1}); err == nil {
		t.Fatal("an id past the vocabulary decoded")
	}
	if got := RenderChat([]Message{{"system", "be brief"}, {"user", "hi"}}); got != "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n" {
		t.Fatalf("chat template: %q", got)
	}
}

func TestSimDeterministicAcrossRegionsAndBlocks(t *testing.T) {
	a, b := testRegion(t, "small", 64), testRegion(t, "small", 64)
	prompt := Encode("the same prompt on two engines, different block ids")
	x := generate(t, a, seqIDs(0, 8), prompt, 20)
	y := generate(t, b, []uint32{40, 3, 17, 9, 60, 22, 1, 5}, prompt, 20)
	if !slices.Equal(x, y) {
		t.Fatalf("outputs differ across engines:\n%v\n%v", x, y)
	}
	z := generate(t, b, seqIDs(10, 8), Encode("another prompt entirely, same length as it is...."), 20)
	if slices.Equal(x, z) {
		t.Fatal("two different prompts gave the same output")
	}
}

// TestResumeEqualsUninterrupted: load the prompt's KV (copied as a pull
// would), recompute k generated tokens, continue: same tokens as the
// uninterrupted run from token k on.
func TestSimResumeEqualsUninterrupted(t *testing.T) {
	src, dst := testRegion(t, "small", 64), testRegion(t, "small", 64)
	prompt := Encode("resume me after a few tokens, please: 0123456789")
	pBlocks := seqIDs(0, 4)
	want := generate(t, src, seqIDs(0, 8), prompt, 24)
	// Prefill only (what the hold keeps).
	ps := NewSequence(one(src), pBlocks, prompt)
	if err := ps.Compute(len(prompt)); err != nil {
		t.Fatal(err)
	}
	const k = 7
	tokens := append(slices.Clone(prompt), want[:k]...)
	dBlocks := []uint32{30, 31, 12, 50, 51, 52, 53, 54}
	copyBlocks(src, pBlocks, dst, dBlocks[:4])
	got, err := resume(one(dst), dBlocks, prompt, tokens, len(want)-k)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want[k:]) {
		t.Fatalf("resumed tokens %v\nwant %v", got, want[k:])
	}
}

// resume plays a resumed decode: the prompt's KV is in blocks of ranks
// (loaded, verified), the tokens after it are recomputed, and n more are
// generated.
func resume(ranks []*kvmem.Region, blocks []uint32, prompt, tokens []uint32, n int) ([]uint32, error) {
	s := NewSequence(ranks, blocks, tokens)
	if err := s.Load(len(prompt)); err != nil {
		return nil, err
	}
	if err := s.Compute(len(tokens)); err != nil {
		return nil, err
	}
	var got []uint32
	for range n {
		tok := s.Next()
		got = append(got, tok)
		s.Append(tok)
	}
	return got, nil
}

func copyBlocks(src *kvmem.Region, sb []uint32, dst *kvmem.Region, db []uint32) {
	for l := uint32(0); l < src.Layout.Layers; l++ {
		for k := uint32(0); k < 2; k++ {
			for i := range sb {
				copy(dst.Block(l, k, db[i]), src.Block(l, k, sb[i]))
			}
		}
	}
}

func TestSimLoadDetectsCorruption(t *testing.T) {
	prompt := Encode("a prompt of forty-eight bytes, three blocks ....")
	other := Encode("another prompt of forty-eight bytes, three blk..")
	src := testRegion(t, "small", 16)
	NewSequence(one(src), seqIDs(0, 3), prompt).Compute(len(prompt))
	NewSequence(one(src), seqIDs(3, 3), other).Compute(len(other))
	cases := map[string]func(dst *kvmem.Region) []uint32{
		"intact": func(dst *kvmem.Region) []uint32 {
			copyBlocks(src, seqIDs(0, 3), dst, seqIDs(0, 3))
			return seqIDs(0, 3)
		},
		"wrong block": func(dst *kvmem.Region) []uint32 {
			copyBlocks(src, []uint32{0, 2, 1}, dst, seqIDs(0, 3)) // two blocks swapped
			return seqIDs(0, 3)
		},
		"another request's block": func(dst *kvmem.Region) []uint32 {
			copyBlocks(src, []uint32{0, 1, 5}, dst, seqIDs(0, 3))
			return seqIDs(0, 3)
		},
		"unwritten block": func(dst *kvmem.Region) []uint32 {
			copyBlocks(src, seqIDs(0, 2), dst, seqIDs(0, 2))
			return seqIDs(0, 3)
		},
		"one word in the last layer": func(dst *kvmem.Region) []uint32 {
			copyBlocks(src, seqIDs(0, 3), dst, seqIDs(0, 3))
			// Position 32 (block 2's first) samples head 2: the first
			// word of its V vector.
			_, off := dst.Layout.ElementAt(1, 0, 2, 0)
			dst.Block(1, 1, 2)[off] ^= 1
			return seqIDs(0, 3)
		},
	}
	for name, set := range cases {
		dst := testRegion(t, "small", 16)
		blocks := set(dst)
		err := NewSequence(one(dst), blocks, prompt).Load(len(prompt))
		if name == "intact" {
			if err != nil {
				t.Fatalf("intact KV rejected: %v", err)
			}
			continue
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: Load = %v, want ErrCorrupt", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
}

func TestSimOutputDependsOnKVContents(t *testing.T) {
	r := testRegion(t, "small", 16)
	prompt := Encode("output follows the KV as read")
	blocks := seqIDs(0, 4)
	want := generate(t, r, blocks, prompt, 8)
	// Same tokens, but one KV word in the region differs: unchecked, the
	// output must change.
	NewSequence(one(r), blocks, prompt).Compute(len(prompt))
	// Position 16 (block 1's first) is a sampled one, of head 1.
	_, off := r.Layout.ElementAt(1, 0, 1, 0)
	binary.LittleEndian.PutUint64(r.Block(0, 1, 1)[off:], 12345)
	s := NewSequence(one(r), blocks, prompt)
	s.Adopt(len(prompt))
	var got []uint32
	for range 8 {
		tok := s.Next()
		got = append(got, tok)
		s.Append(tok)
	}
	if slices.Equal(got, want) {
		t.Fatal("output unchanged although the KV read from the region differs")
	}
}

// BenchmarkSimLlamaFillAndVerify: an 8192-token prompt on the llama3-8b
// layout (1 GiB) is filled (a simulated prefill) and verified (a load's
// sampled check), against clearing the same GiB in the same run. It prints
// SIMKV fill_gbps=<a> clear_gbps=<b> ratio=<a/b> verify_ms=<c>; the goal
// is a fill near memory speed and a verify of a few ms (a load's cost on
// the resume path).
func BenchmarkSimLlamaFillAndVerify(b *testing.B) {
	r := testRegion(b, "llama3-8b", 512)
	prompt := make([]uint32, 8192)
	for i := range prompt {
		prompt[i] = uint32(i*7) % 256
	}
	if err := NewSequence(one(r), seqIDs(0, 512), prompt).Compute(len(prompt)); err != nil { // first touch of the pages
		b.Fatal(err)
	}
	var fill, verify, clear time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := NewSequence(one(r), seqIDs(0, 512), prompt).Compute(len(prompt)); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := NewSequence(one(r), seqIDs(0, 512), prompt).Load(len(prompt)); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		clearBytes(r.Bytes())
		fill, verify, clear = fill+t1.Sub(t0), verify+t2.Sub(t1), clear+time.Since(t2)
	}
	n := float64(b.N)
	gbps := func(d time.Duration) float64 { return float64(r.Layout.Size()) * n / d.Seconds() / 1e9 }
	fmt.Printf("SIMKV fill_gbps=%.1f clear_gbps=%.1f ratio=%.2f verify_ms=%.2f\n", gbps(fill), gbps(clear), gbps(fill)/gbps(clear), float64(verify.Microseconds())/1000/n)
}

// clearBytes zeroes p (the runtime's memclr: the reference speed).
func clearBytes(p []byte) { clear(p) }

// TestSimLlamaFillAndVerify: a 1 GiB prompt's KV written by Compute loads
// back (every sampled word of every layer and plane checks out).
func TestSimLlamaFillAndVerify(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GiB")
	}
	r := testRegion(t, "llama3-8b", 512)
	prompt := make([]uint32, 8192)
	for i := range prompt {
		prompt[i] = uint32(i*7) % 256
	}
	if err := NewSequence(one(r), seqIDs(0, 512), prompt).Compute(len(prompt)); err != nil {
		t.Fatal(err)
	}
	if err := NewSequence(one(r), seqIDs(0, 512), prompt).Load(len(prompt)); err != nil {
		t.Fatal(err)
	}
}

// shapeRegions makes the regions of every rank of an engine of shape
// (small layout, 64 blocks).
func shapeRegions(t testing.TB, shape Shape) []*kvmem.Region {
	t.Helper()
	return layeredRegions(t, shape, 0)
}

// layeredRegions is shapeRegions with layers layers (0: the small
// layout's).
func layeredRegions(t testing.TB, shape Shape, layers uint32) []*kvmem.Region {
	t.Helper()
	l, err := LookupLayout("small", 64, shape)
	if err != nil {
		t.Fatal(err)
	}
	if layers != 0 {
		l.Layers = layers
	}
	var out []*kvmem.Region
	for r := range l.TPSize {
		rl := l
		rl.TPRank = r
		reg, err := regionfile.CreateMemfd("sim-test", rl)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { reg.Close() })
		out = append(out, reg)
	}
	return out
}

var testShapes = []Shape{{}, {TP: 2, BlockSize: 32, Order: kvmem.OrderHND}, {TP: 4, BlockSize: 8, Order: kvmem.OrderCPU}, {TP: 8, Order: kvmem.OrderNHD}}

// TestSimSameAnswerEveryShape: the output is a function of the tokens and
// their KV, not of the engine's TP size, block size or in-block order
// (TP 8 replicates the 4 heads).
func TestSimSameAnswerEveryShape(t *testing.T) {
	prompt := Encode("one prompt, four engine shapes, one answer")
	var want []uint32
	for i, sh := range testShapes {
		got := generateFresh(t, shapeRegions(t, sh), prompt, 16)
		if i == 0 {
			want = got
		} else if !slices.Equal(got, want) {
			t.Fatalf("shape %+v answers %v, TP 1 %v", sh, got, want)
		}
	}
}

// generateFresh is generateOn into the first blocks from block 3 that
// hold prompt and output.
func generateFresh(t testing.TB, ranks []*kvmem.Region, prompt []uint32, n int) []uint32 {
	bs := int(ranks[0].Layout.BlockSize)
	return generateOn(t, ranks, seqIDs(3, (len(prompt)+n+bs-1)/bs), prompt, n)
}

// TestSimResumeAcrossShapes: KV prefilled on one shape, moved as connexd
// translates it (kvmem.Transfer) into every rank of another, loads (every
// head of the sampled positions verified) and continues with the
// uninterrupted run's tokens, for every pair of shapes.
func TestSimResumeAcrossShapes(t *testing.T) {
	prompt := Encode("prefilled on one shape, resumed on another: 0123456789abcdef")
	want := generateFresh(t, shapeRegions(t, Shape{}), prompt, 20)
	const k = 5
	for _, from := range testShapes {
		for _, to := range testShapes {
			src := shapeRegions(t, from)
			bs := int(src[0].Layout.BlockSize)
			srcIDs := []uint32{9, 10, 2, 3, 40, 41, 42, 43, 44}[:(len(prompt)+bs-1)/bs]
			if err := NewSequence(src, srcIDs, prompt).Compute(len(prompt)); err != nil {
				t.Fatal(err)
			}
			dst := shapeRegions(t, to)
			dl := dst[0].Layout
			_, nDst, err := kvmem.PullSize(uint32(bs), len(srcIDs), uint32(len(prompt)), dl.BlockSize)
			if err != nil {
				t.Fatal(err)
			}
			dstIDs := seqIDs(20, max(nDst, (len(prompt)+20+int(dl.BlockSize)-1)/int(dl.BlockSize)))
			mems := make([][]byte, len(src))
			for r := range src {
				mems[r] = src[r].Bytes()
			}
			for _, d := range dst {
				tr, err := kvmem.Translate(src[0].Layout, d.Layout)
				if err != nil {
					t.Fatal(err)
				}
				x, err := tr.ForPull(srcIDs, dstIDs[:nDst], uint32(len(prompt)))
				if err != nil {
					t.Fatal(err)
				}
				x.Copy(mems, d.Bytes())
			}
			tokens := append(slices.Clone(prompt), want[:k]...)
			got, err := resume(dst, dstIDs, prompt, tokens, len(want)-k)
			if err != nil {
				t.Fatalf("%+v -> %+v: %v", from, to, err)
			}
			if !slices.Equal(got, want[k:]) {
				t.Fatalf("%+v -> %+v: resumed %v, want %v", from, to, got, want[k:])
			}
		}
	}
}
