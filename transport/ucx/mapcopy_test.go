//go:build ucx && cgo

package ucx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/connex/connex/transport"
)

// TestCopyStridedMapped copies strided ops from two fake mappings (Go
// memory standing for a holder's segments) and compares the destination
// with a plain piece-by-piece copy: every piece lands, nothing between the
// pieces is written, ops without a key (empty ones) are skipped. The
// geometries cross grain boundaries inside an op and at its end, mix
// pieces below and above pairMinBytes (copied in pairs), and include
// pieces longer than a grain (the piece-list path).
func TestCopyStridedMapped(t *testing.T) {
	cases := []struct {
		name  string
		len   []int // piece length of each op
		count []int
	}{
		{"tp-nhd", []int{1 << 10, 1 << 10, 1 << 10}, []int{16, 16, 16}},
		{"many-small", []int{1 << 10}, []int{3000}},
		{"grain-crossing", []int{300 << 10, 700 << 10, 12 << 10}, []int{5, 3, 7}},
		{"exact-grain", []int{mapPieceBytes / 4}, []int{8}},
		{"odd-pairs", []int{8 << 10, 9 << 10, 1}, []int{3, 1, 5}},
		{"over-grain", []int{mapPieceBytes + 4096, 2 << 10}, []int{2, 4}},
		{"with-empty", []int{0, 4 << 10, 0}, []int{1, 6, 1}},
	}
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ci), 7))
			seg := [][]byte{randBytes(8<<20, uint64(ci)+1), randBytes(8<<20, uint64(ci)+2)}
			keys := []keyInfo{{rk: remoteKey{base: 1 << 40}}, {rk: remoteKey{base: 3 << 40}}}
			ptrs := []unsafe.Pointer{unsafe.Pointer(&seg[0][0]), unsafe.Pointer(&seg[1][0])}
			var ops []transport.StridedOp
			var opKey []int32
			for j := range c.len {
				l, n := c.len[j], c.count[j]
				k := j % 2
				rs := uint64(l + rng.IntN(64))
				ds := l + rng.IntN(3)*64
				dst := make([]byte, (n-1)*ds+l)
				off := uint64(rng.IntN(4096))
				op := transport.StridedOp{RemoteAddr: keys[k].rk.base + off, RemoteStride: rs, Dst: dst, DstStride: ds, Len: l, Count: n}
				if op.Span() > uint64(len(seg[k]))-off {
					t.Fatalf("case too large for its segment: op %d spans %d bytes", j, op.Span())
				}
				key := int32(k)
				if l == 0 {
					key = -1 // planRanges gives empty ops no key
				}
				ops, opKey = append(ops, op), append(opKey, key)
			}
			want := make([][]byte, len(ops))
			for j, op := range ops {
				want[j] = bytes.Repeat([]byte{0xEE}, len(op.Dst))
				fillByte(op.Dst, 0xEE)
				if opKey[j] < 0 {
					continue
				}
				src := seg[opKey[j]][op.RemoteAddr-keys[opKey[j]].rk.base:]
				for p := range op.Count {
					copy(want[j][p*op.DstStride:p*op.DstStride+op.Len], src[uint64(p)*op.RemoteStride:])
				}
			}
			if err := copyStridedMapped(context.Background(), ops, opKey, keys, ptrs); err != nil {
				t.Fatal(err)
			}
			for j, op := range ops {
				if !bytes.Equal(op.Dst, want[j]) {
					i := 0
					for i < len(op.Dst) && op.Dst[i] == want[j][i] {
						i++
					}
					t.Fatalf("op %d (%d pieces of %d bytes): first wrong byte at %d of %d", j, op.Count, op.Len, i, len(op.Dst))
				}
			}
			// A done context copies nothing and says so.
			for _, op := range ops {
				fillByte(op.Dst, 0xEE)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := copyStridedMapped(ctx, ops, opKey, keys, ptrs); !errors.Is(err, transport.ErrCanceled) {
				t.Fatalf("canceled copy: %v, want ErrCanceled", err)
			}
			for j, op := range ops {
				if !bytes.Equal(op.Dst, bytes.Repeat([]byte{0xEE}, len(op.Dst))) {
					t.Fatalf("canceled copy wrote op %d", j)
				}
			}
		})
	}
}

func fillByte(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// TestStridedGrains checks the grains of strided ops: every piece of every
// op with a key in exactly one grain, in order, and each grain at most a
// grain's bytes plus one piece (a piece longer than a grain alone).
func TestStridedGrains(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	for trial := range 300 {
		grain := 1 + rng.IntN(64<<10)
		n := rng.IntN(6)
		ops := make([]transport.StridedOp, n)
		opKey := make([]int32, n)
		for j := range ops {
			ops[j] = transport.StridedOp{Len: rng.IntN(20 << 10), Count: 1 + rng.IntN(40)}
			if rng.IntN(5) == 0 || ops[j].Len == 0 {
				opKey[j] = -1
			}
		}
		t.Run(fmt.Sprint(trial), func(t *testing.T) {
			bounds := stridedGrains(ops, opKey, grain)
			if bounds[0] != (stridedPos{}) || bounds[len(bounds)-1] != (stridedPos{n, 0}) || len(bounds) < 2 {
				t.Fatalf("bounds %v: want {0 0} … {%d 0}", bounds, n)
			}
			seen := 0
			for g := range len(bounds) - 1 {
				from, to := bounds[g], bounds[g+1]
				if to.op < from.op || (to.op == from.op && to.piece < from.piece) {
					t.Fatalf("grain %d runs backwards: %v → %v (bounds %v)", g, from, to, bounds)
				}
				bytes, pieces, longest := 0, 0, 0
				for j := from.op; j <= to.op && j < n; j++ {
					if opKey[j] < 0 {
						continue
					}
					first, end := 0, ops[j].Count
					if j == from.op {
						first = from.piece
					}
					if j == to.op {
						end = to.piece
					}
					pieces += end - first
					bytes += (end - first) * ops[j].Len
					longest = max(longest, ops[j].Len)
				}
				if bytes > grain+longest {
					t.Fatalf("grain %d holds %d bytes, grain %d, longest piece %d", g, bytes, grain, longest)
				}
				if pieces == 0 && g < len(bounds)-2 {
					t.Fatalf("grain %d of %d is empty: %v → %v (bounds %v)", g, len(bounds)-1, from, to, bounds)
				}
				seen += pieces
			}
			want := 0
			for j, op := range ops {
				if opKey[j] >= 0 {
					want += op.Count
				}
			}
			if seen != want {
				t.Fatalf("grains hold %d pieces, ops %d (bounds %v)", seen, want, bounds)
			}
		})
	}
}

// BenchmarkCopyStrided compares the strided copy from ops (copyStridedMapped)
// with the same copy through a piece list (copyStridedPieces), 32 MiB a
// call (a read batch) in the shapes of BenchmarkPullHetero's TP-2 pulls:
// NHD (pieces of 1 KiB, 16 an op) and HND (one 16 KiB piece an op).
func BenchmarkCopyStrided(b *testing.B) {
	const total = 32 << 20
	for _, c := range []struct {
		name       string
		len, count int
	}{{"nhd", 1 << 10, 16}, {"hnd", 16 << 10, 1}} {
		src, dst := make([]byte, 2*total), make([]byte, 2*total)
		keys := []keyInfo{{rk: remoteKey{base: 1 << 40}}}
		ptrs := []unsafe.Pointer{unsafe.Pointer(&src[0])}
		var ops []transport.StridedOp
		var opKey []int32
		per := c.len * c.count
		for j := range total / per {
			// Scattered blocks: op j's destination is every other piece
			// of a 2×per block (the other rank's half left alone).
			blk := (j * 7919) % (total / per)
			op := transport.StridedOp{RemoteAddr: keys[0].rk.base + uint64(blk*2*per), RemoteStride: uint64(c.len), Dst: dst[blk*2*per : blk*2*per+2*per], DstStride: 2 * c.len, Len: c.len, Count: c.count}
			if c.count == 1 {
				op.Dst, op.DstStride = dst[blk*2*per:blk*2*per+per], 0
			}
			ops, opKey = append(ops, op), append(opKey, 0)
		}
		for _, f := range []struct {
			name string
			fn   func(context.Context, []transport.StridedOp, []int32, []keyInfo, []unsafe.Pointer) error
		}{{"pieces", copyStridedPieces}, {"ops", copyStridedMapped}} {
			b.Run(c.name+"/"+f.name, func(b *testing.B) {
				b.SetBytes(total)
				for b.Loop() {
					if err := f.fn(context.Background(), ops, opKey, keys, ptrs); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
