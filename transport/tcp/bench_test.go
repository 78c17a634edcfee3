package tcp

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// BenchmarkGet measures loopback GET throughput with the default Config:
// one 256 MiB contiguous op, and 128 MiB in pieces of 32 KiB and of 16 KiB
// (a TP rank's half of a block) at scattered offsets into disjoint slices of
// one buffer (the shape of paged KV blocks), NHD-shaped strided ops, and a
// small pull's two 64 KiB pieces (what a Get costs beside its bytes).
//
//	go test -run xxx -bench . -benchtime 3x ./transport/tcp/
func BenchmarkGet(b *testing.B) {
	benchGet(b, Config{})
}

// BenchmarkGetConns compares connection counts per endpoint.
func BenchmarkGetConns(b *testing.B) {
	for _, n := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("conns=%d", n), func(b *testing.B) { benchGet(b, Config{ConnsPerEndpoint: n}) })
	}
}

func benchGet(b *testing.B, cfg Config) { benchGetCfg(b, Config{}, cfg) }

func benchGetCfg(b *testing.B, serverCfg, clientCfg Config) {
	const regSize = 256 << 20
	server := openBackend(b, serverCfg)
	client := openBackend(b, clientCfg)
	mem := randomBytes(41, regSize)
	reg := register(b, server, mem)
	ep := connect(b, client, server)
	key := reg.RemoteKey()
	dst := make([]byte, regSize)

	b.Run("256MiB", func(b *testing.B) {
		ops := []transport.GetOp{{RemoteKey: key, Dst: dst}}
		runGet(b, ep, ops, regSize)
	})
	for _, piece := range []int{32 << 10, 16 << 10} {
		b.Run(fmt.Sprintf("%dx%dKiB", (128<<20)/piece, piece>>10), func(b *testing.B) { benchPieces(b, ep, key, dst, piece, (128<<20)/piece) })
	}
	// A small pull's Get (the fixed pulls of make bench-pull): what a Get
	// costs beside its bytes; give it a few thousand iterations of its own
	// (-bench 'Get$/2x64KiB' -benchtime 2000x).
	b.Run("2x64KiB", func(b *testing.B) { benchPieces(b, ep, key, dst, 64<<10, 2) })
	// A TP rank's heads of every token of a token-major block: 16 KiB
	// back to back at the holder, in 1 KiB pieces 2 KiB apart in dst.
	b.Run("8192x16x1KiB-strided", func(b *testing.B) {
		const n, piece, count = 8192, 1 << 10, 16
		rng := rand.New(rand.NewPCG(3, 4))
		perm := rng.Perm(regSize / (piece * count))
		ops := make([]transport.StridedOp, n)
		for i := range ops {
			ops[i] = transport.StridedOp{RemoteKey: key, RemoteAddr: uint64(perm[i] * piece * count), RemoteStride: piece,
				Dst: dst[i*2*piece*count:], DstStride: 2 * piece, Len: piece, Count: count}
		}
		b.SetBytes(n * piece * count)
		ctx := context.Background()
		if err := ep.GetStrided(ctx, ops); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			if err := ep.GetStrided(ctx, ops); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// benchPieces reads n pieces of piece bytes from scattered offsets of the
// registration into disjoint slices of dst.
func benchPieces(b *testing.B, ep transport.Endpoint, key []byte, dst []byte, piece, n int) {
	rng := rand.New(rand.NewPCG(1, 2))
	ops := make([]transport.GetOp, n)
	perm := rng.Perm(len(dst) / piece)
	for i := range ops {
		ops[i] = transport.GetOp{
			RemoteKey:  key,
			RemoteAddr: uint64(perm[i] * piece),
			Dst:        dst[i*piece : (i+1)*piece],
		}
	}
	runGet(b, ep, ops, int64(n*piece))
}

func runGet(b *testing.B, ep transport.Endpoint, ops []transport.GetOp, bytes int64) {
	b.SetBytes(bytes)
	ctx := context.Background()
	// One warm-up so page faults on dst and socket buffer growth do not
	// count against the first iteration.
	if err := ep.Get(ctx, ops); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu := processCPU()
	for range b.N {
		if err := ep.Get(ctx, ops); err != nil {
			b.Fatal(err)
		}
	}
	// CPU per GB (both ends together) is steadier than MB/s on a shared
	// machine: it tells what the copy costs, not who else ran.
	if cpu > 0 {
		b.ReportMetric((processCPU()-cpu).Seconds()/(float64(bytes)*float64(b.N)/1e9), "cpu-s/GB")
	}
}

// BenchmarkGetTLS measures what data_tls costs a pull: 64 MiB Gets over a
// plaintext and a mutual-TLS endpoint on loopback, interleaved in one run,
// printing TLSDATA plain_gbps=<a> tls_gbps=<b> ratio=<b/a>.
//
//	go test -run xxx -bench GetTLS -benchtime 20x ./transport/tcp/
func BenchmarkGetTLS(b *testing.B) {
	const size = 64 << 20
	pool, cert := testCA(b, "bench")
	sec := tlsConfigs(pool, cert)
	mem := randomBytes(43, size)
	plainServer, tlsServer := openBackend(b, Config{}), openBackend(b, Config{ServerTLS: sec.ServerTLS})
	plainReg, tlsReg := register(b, plainServer, mem), register(b, tlsServer, mem)
	plainEP := connect(b, openBackend(b, Config{}), plainServer)
	tlsEP := connect(b, openBackend(b, Config{ClientTLS: sec.ClientTLS}), tlsServer)
	dst := make([]byte, size)
	ctx := context.Background()
	get := func(ep transport.Endpoint, reg transport.Registration) time.Duration {
		t0 := time.Now()
		if err := ep.Get(ctx, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: dst}}); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	get(plainEP, plainReg)
	get(tlsEP, tlsReg)
	b.ResetTimer()
	var plain, sealed time.Duration
	for range b.N {
		plain += get(plainEP, plainReg)
		sealed += get(tlsEP, tlsReg)
	}
	b.StopTimer()
	gbps := func(d time.Duration) float64 { return float64(size) * float64(b.N) * 8 / d.Seconds() / 1e9 }
	b.ReportMetric(gbps(sealed)/gbps(plain), "tls_ratio")
	fmt.Printf("TLSDATA plain_gbps=%.2f tls_gbps=%.2f ratio=%.2f\n", gbps(plain), gbps(sealed), gbps(sealed)/gbps(plain))
}
