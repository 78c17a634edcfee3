//go:build ucx && cgo

package ucx

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// Pull benchmarks: the same bytes moved by memcpy (the physical limit here),
// by UCX over its default transports, and by UCX over TCP, for one
// contiguous 256 MiB region and for a KV layout of 32 layers x K,V x 64
// blocks of 32 KiB (4096 pieces, 128 MiB) read in shuffled order, so that
// nothing coalesces.
//
//	go test -tags ucx -run '^$' -bench Pull -benchtime 10x ./transport/ucx/

type layout struct {
	name          string
	size          int // registered bytes
	pieces, block int // 0 pieces: one contiguous GET of size
}

var layouts = []layout{
	{name: "contig256MiB", size: 256 << 20},
	{name: "kv4096x32KiB", size: 128 << 20, pieces: 4096, block: 32 << 10},
}

func BenchmarkPull(b *testing.B) {
	for _, l := range layouts {
		b.Run(l.name+"/memcpy", func(b *testing.B) { benchMemcpy(b, l) })
		b.Run(l.name+"/ucx", func(b *testing.B) { benchUCX(b, l, Config{}, false) })
		b.Run(l.name+"/ucx-onesided", func(b *testing.B) { benchUCX(b, l, Config{Reads: ReadsOneSided}, false) })
		b.Run(l.name+"/ucx-alloc", func(b *testing.B) { benchUCX(b, l, Config{}, true) })
		b.Run(l.name+"/ucx-tcp", func(b *testing.B) { benchUCX(b, l, Config{TLS: "tcp"}, false) })
		b.Run(l.name+"/ucx-env", func(b *testing.B) {
			benchUCX(b, l, Config{TLS: os.Getenv("CX_TLS"), Reads: os.Getenv("CX_READS")}, false)
		})
	}
}

func pieceOps(l layout, key []byte, base uint64, dst []byte) []transport.GetOp {
	if l.pieces == 0 {
		return []transport.GetOp{{RemoteKey: key, RemoteAddr: base, Dst: dst}}
	}
	ops := make([]transport.GetOp, l.pieces)
	for i, p := range shuffled(l.pieces) {
		ops[i] = transport.GetOp{RemoteKey: key, RemoteAddr: base + uint64(p*l.block), Dst: dst[i*l.block : (i+1)*l.block]}
	}
	return ops
}

func shuffled(n int) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	x := uint64(12345)
	for i := n - 1; i > 0; i-- {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		j := int(x % uint64(i+1))
		p[i], p[j] = p[j], p[i]
	}
	return p
}

// benchMemcpy copies the pieces from alternating source buffers, so the
// source is never cache-hot (as in a pull, where the holder's bytes are cold).
func benchMemcpy(b *testing.B, l layout) {
	srcs := [2][]byte{randBytes(l.size, 1), randBytes(l.size, 2)}
	dst := make([]byte, l.size)
	clear(dst)
	b.SetBytes(int64(l.size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		src := srcs[i%2]
		if l.pieces == 0 {
			copy(dst, src)
			continue
		}
		for j, p := range shuffled(l.pieces) {
			copy(dst[j*l.block:(j+1)*l.block], src[p*l.block:(p+1)*l.block])
		}
	}
}

func benchUCX(b *testing.B, l layout, cfg Config, alloc bool) {
	cfg.ChunkBytes, _ = strconv.Atoi(os.Getenv("CX_CHUNK"))
	h, err := OpenConfig(transport.Options{}, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	r, err := OpenConfig(transport.Options{}, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	var regs [2]transport.Registration
	for i := range regs {
		if alloc {
			a, err := h.Alloc(l.size)
			if err != nil {
				b.Fatal(err)
			}
			copy(a.Bytes(), randBytes(l.size, uint64(i)))
			regs[i] = a
		} else {
			reg, err := h.Register(randBytes(l.size, uint64(i)))
			if err != nil {
				b.Fatal(err)
			}
			regs[i] = reg
		}
	}
	ep := connectT(b, r, h)
	dst := make([]byte, l.size)
	clear(dst)
	var ops [2][]transport.GetOp
	for i := range ops {
		ops[i] = pieceOps(l, regs[i].RemoteKey(), regs[i].RemoteAddr(), dst)
	}
	// Warm up: connection establishment and the first touch of each
	// region's pages (page faults) are not part of a steady-state pull.
	for i := range ops {
		if err := getT(ep, 30*time.Second, ops[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(l.size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		err := ep.Get(ctx, ops[i%2])
		cancel()
		if err != nil {
			b.Fatal(err)
		}
	}
}
