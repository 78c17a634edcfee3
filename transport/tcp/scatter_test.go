package tcp

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/connex/connex/transport"
)

// TestPlanStrided: an op whose pieces lie back to back at the holder is
// planned as requests of whole pieces (at most the chunk size each), its
// payload scattered at the destination stride; one contiguous at both ends
// as a plain read; one strided at the holder as a request per piece; a
// malformed op is refused.
func TestPlanStrided(t *testing.T) {
	key := encodeKey(remoteKey{id: 7})
	dst := make([]byte, 64<<10)
	ops := []transport.StridedOp{
		// 10 pieces of 1 KiB back to back at the holder, 2 KiB apart here.
		{RemoteKey: key, RemoteAddr: 1 << 20, RemoteStride: 1024, Dst: dst, DstStride: 2048, Len: 1024, Count: 10},
		// Back to back at both ends: one read of 8 KiB (two chunks).
		{RemoteKey: key, RemoteAddr: 2 << 20, RemoteStride: 512, Dst: dst[32<<10:], DstStride: 512, Len: 512, Count: 16},
		// Strided at the holder: a request per piece.
		{RemoteKey: key, RemoteAddr: 3 << 20, RemoteStride: 4096, Dst: dst[48<<10:], DstStride: 1024, Len: 1024, Count: 3},
	}
	chunks, err := planStrided(ops, 4096)
	if err != nil {
		t.Fatal(err)
	}
	type want struct {
		op, n, piece, stride, dstLen int
		off                          uint64
	}
	wants := []want{
		{0, 4096, 1024, 2048, 3*2048 + 1024, 1 << 20},
		{0, 4096, 1024, 2048, 3*2048 + 1024, 1<<20 + 4096},
		{0, 2048, 1024, 2048, 2048 + 1024, 1<<20 + 8192},
		{1, 4096, 0, 0, 4096, 2 << 20},
		{1, 4096, 0, 0, 4096, 2<<20 + 4096},
		{2, 1024, 0, 0, 1024, 3 << 20},
		{2, 1024, 0, 0, 1024, 3<<20 + 4096},
		{2, 1024, 0, 0, 1024, 3<<20 + 8192},
	}
	if len(chunks) != len(wants) {
		t.Fatalf("%d chunks, want %d: %+v", len(chunks), len(wants), chunks)
	}
	for i, w := range wants {
		c := chunks[i]
		got := want{c.op, c.to.n, c.to.piece, c.to.stride, len(c.dst), c.off}
		if got != w {
			t.Errorf("chunk %d: %+v, want %+v", i, got, w)
		}
	}
	// Two ops that continue one another at both ends (a head range of
	// adjacent blocks) are one run: 6 + 2 pieces, two requests of 4; a
	// third that skips a piece at the holder is not.
	run := []transport.StridedOp{
		{RemoteKey: key, RemoteAddr: 0, RemoteStride: 1024, Dst: dst, DstStride: 2048, Len: 1024, Count: 6},
		{RemoteKey: key, RemoteAddr: 6 * 1024, RemoteStride: 1024, Dst: dst[6*2048:], DstStride: 2048, Len: 1024, Count: 2},
		{RemoteKey: key, RemoteAddr: 9 * 1024, RemoteStride: 1024, Dst: dst[8*2048:], DstStride: 2048, Len: 1024, Count: 2},
	}
	// As pull hands them: each op's destination capped to its own pieces.
	for i := range run {
		n := (run[i].Count-1)*run[i].DstStride + run[i].Len
		run[i].Dst = run[i].Dst[:n:n]
	}
	merged, err := planStrided(run, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if len(merged) != 3 || merged[0].to.n != 4096 || merged[1].to.n != 4096 || merged[1].off != 4096 || merged[1].op != 0 ||
		len(merged[1].dst) != 3*2048+1024 || &merged[1].dst[0] != &dst[4*2048] || merged[2].op != 2 || merged[2].off != 9*1024 {
		t.Fatalf("a run of two ops and one apart: %d requests, want 3 (4 + 4 pieces, then 2)", len(merged))
	}
	// Pieces larger than the chunk size go as GetOps, split (a request
	// over MaxRequestBytes would cost the connection).
	big, err := planStrided([]transport.StridedOp{{RemoteKey: key, RemoteStride: 8192, Dst: dst, DstStride: 16384, Len: 8192, Count: 2}}, 4096)
	if err != nil || len(big) != 4 {
		t.Fatalf("pieces over the chunk size: %d requests (%v); want 4", len(big), err)
	}
	for i, c := range big {
		if c.to.n != 4096 || c.to.piece != 0 || c.off != uint64(i*4096) || &c.dst[0] != &dst[i/2*16384+i%2*4096] {
			t.Fatalf("pieces over the chunk size: request %d reads %d bytes at %d (piece %d)", i, c.to.n, c.off, c.to.piece)
		}
	}
	if _, err := planStrided([]transport.StridedOp{{RemoteKey: key, RemoteStride: 1024, Dst: dst[:1500], DstStride: 1024, Len: 1024, Count: 2}}, 4096); err == nil {
		t.Fatal("an op whose pieces overflow its destination was planned")
	}
	if _, err := planStrided([]transport.StridedOp{{RemoteKey: []byte("short"), RemoteStride: 1024, Dst: dst, DstStride: 2048, Len: 1024, Count: 2}}, 4096); err == nil {
		t.Fatal("an op with a malformed key was planned")
	}
}

// TestGetStridedScatters: strided ops read over a real connection land
// where they should — pieces back to back at the holder scattered across
// requests of a small chunk size, the destination's gaps untouched — and a
// key deregistered fails the read.
func TestGetStridedScatters(t *testing.T) {
	server := openBackend(t, Config{})
	client := openBackend(t, Config{ChunkBytes: 4096})
	mem := randomBytes(5, 1<<16)
	reg, err := server.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	ep := connect(t, client, server)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const piece, count = 1000, 13 // pieces that straddle the 4 KiB requests' ends
	dst := bytes.Repeat([]byte{0xee}, 2*piece*count)
	other := make([]byte, 3*512)
	ops := []transport.StridedOp{
		{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + 100, RemoteStride: piece, Dst: dst, DstStride: 2 * piece, Len: piece, Count: count},
		{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + 40000, RemoteStride: 2048, Dst: other, DstStride: 512, Len: 512, Count: 3},
	}
	if err := ep.GetStrided(ctx, ops); err != nil {
		t.Fatal(err)
	}
	for i := range count {
		got, want := dst[2*i*piece:2*i*piece+piece], mem[100+i*piece:100+(i+1)*piece]
		if !bytes.Equal(got, want) {
			t.Fatalf("piece %d differs from the holder's bytes", i)
		}
		if gap := dst[2*i*piece+piece : 2*(i+1)*piece]; !bytes.Equal(gap, bytes.Repeat([]byte{0xee}, piece)) {
			t.Fatalf("the gap after piece %d was written", i)
		}
	}
	for i := range 3 {
		if !bytes.Equal(other[i*512:(i+1)*512], mem[40000+i*2048:40000+i*2048+512]) {
			t.Fatalf("strided-at-the-holder piece %d differs", i)
		}
	}
	if err := reg.Deregister(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, ep.GetStrided(ctx, ops[:1]), transport.ErrNotRegistered)
}

// TestPlanStridedCoversEveryPiece: for random strided ops over one
// destination (some continuing one another, some contiguous, some strided
// at the holder), the planned requests read every piece's bytes from the
// right holder offset into the right destination bytes, each once, and
// nothing else — the runs of adjacent ops included.
func TestPlanStridedCoversEveryPiece(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	key := encodeKey(remoteKey{id: 9})
	for trial := range 300 {
		dst := make([]byte, 1<<16)
		// want[i] = holder offset + 1 whose byte lands at dst[i] (0: none).
		want := make([]uint64, len(dst))
		var ops []transport.StridedOp
		var starts []int // each op's first destination byte
		at, remote := 0, uint64(1000)
		for len(ops) < 1+rng.IntN(6) {
			l := 1 + rng.IntN(300)
			stride := l + rng.IntN(3)*rng.IntN(200) // sometimes contiguous
			rstride := uint64(l)
			if rng.IntN(4) == 0 {
				rstride += uint64(1 + rng.IntN(50)) // strided at the holder
			}
			count := 1 + rng.IntN(20)
			span := (count-1)*stride + l
			if rng.IntN(3) == 0 && len(ops) > 0 {
				// Continue the previous op at the holder, and half the
				// time in the destination too (a run; else not one).
				p := ops[len(ops)-1]
				l, stride, rstride = p.Len, p.DstStride, p.RemoteStride
				span = (count-1)*stride + l
				if rng.IntN(2) == 0 {
					at = starts[len(starts)-1] + p.Count*p.DstStride
				}
				remote = p.RemoteAddr + uint64(p.Count)*p.RemoteStride
			}
			if at+span > len(dst) {
				break
			}
			// Capped to its own pieces, as pull hands them.
			op := transport.StridedOp{RemoteKey: key, RemoteAddr: remote, RemoteStride: rstride, Dst: dst[at : at+span : at+span], DstStride: stride, Len: l, Count: count}
			starts = append(starts, at)
			for i := range count {
				for b := range l {
					want[at+i*stride+b] = remote + uint64(i)*rstride + uint64(b) + 1
				}
			}
			ops = append(ops, op)
			at += span + rng.IntN(64)
			remote += uint64(count)*rstride + uint64(rng.IntN(3)*100)
		}
		chunks, err := planStrided(ops, 1+rng.IntN(4096))
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		got := make([]uint64, len(dst))
		base := uintptr(unsafe.Pointer(unsafe.SliceData(dst)))
		for _, c := range chunks {
			if len(c.dst) == 0 {
				continue
			}
			first := int(uintptr(unsafe.Pointer(&c.dst[0])) - base)
			for off := 0; off < c.to.n; {
				part := c.to.at(c.dst, off)
				start := first + int(uintptr(unsafe.Pointer(unsafe.SliceData(part)))-uintptr(unsafe.Pointer(&c.dst[0])))
				for b := range part {
					if got[start+b] != 0 {
						t.Fatalf("trial %d: dst byte %d written twice", trial, start+b)
					}
					got[start+b] = c.off + uint64(off+b) + 1
				}
				off += len(part)
			}
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("trial %d: dst byte %d gets holder byte %d, want %d (ops %+v)", trial, i, int64(got[i])-1, int64(want[i])-1, ops)
			}
		}
	}
}
