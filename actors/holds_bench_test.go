package actors_test

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/actors"
	"github.com/connex/connex/daemon"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/regionfile"
	"github.com/connex/connex/lease"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
)

// BenchmarkHolds (make bench-holds) creates BENCH_HOLDS live holds (default
// 100k) in one actor system the way connexd's hold.create does — a
// CreateHold ask to the HoldSupervisor, a supervised hold actor per transfer
// with its lease timer and its registration in the data plane connexd
// opens by default (backend=auto: UCX where libucx loads, else TCP), on a
// region created as region.create creates one — and prints what each live
// hold costs: Go heap and process RSS bytes, goroutines, against the bare
// lease.Hold state machine measured in the same run.
//
// Geometry: 32 layers × K/V, 16 blocks per hold (256 tokens at block size
// 16), in one run (one extent per layer-plane: 64 extents per hold), the
// blocks of consecutive holds in turn over a 16384-block region.
func BenchmarkHolds(b *testing.B) {
	n := 100_000
	if s := os.Getenv("BENCH_HOLDS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			b.Fatalf("BENCH_HOLDS=%q: want a positive count", s)
		}
		n = v
	}
	backend := os.Getenv("BENCH_HOLDS_BACKEND")
	if backend == "" {
		backend = "auto"
	}
	if os.Getenv("BENCH_HOLDS_HEAPPROFILE") != "" {
		runtime.MemProfileRate = 64 // every object of a hold shows in the profile
	}
	const perHold = 16
	l := kvmem.Layout{Layers: 32, Planes: 2, Blocks: 16384, BlockBytes: 64, BlockSize: 16, TPSize: 1}
	for i := 0; i < b.N; i++ {
		ref := measure(n, func(n int) any {
			hs := make([]*lease.Hold, n)
			now := time.Now()
			for i := range hs {
				h, err := lease.New(now, lease.Config{Retain: time.Minute, Mode: lease.OnFinish, Owner: "e"})
				if err != nil {
					b.Fatal(err)
				}
				hs[i] = h
			}
			return hs
		})
		b.Logf("reference: %d bare lease.Hold: %.0f heap bytes each", n, ref.heap)

		be, err := daemon.OpenBackend(daemon.BackendConfig{Name: backend, Options: transport.Options{ListenAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)}})
		if err != nil {
			b.Fatal(err)
		}
		region := newRegion(b, be, l)
		regions := kvmem.NewRegionTable(nil)
		mapped, err := regions.Add("e", "r", region)
		if err != nil {
			b.Fatal(err)
		}
		sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
		deps := &actors.HoldDeps{
			Backend: be, Ctrl: &messages.RemoteCtrl{Member: "m", Backend: be.Name(), DataAddr: be.Address()},
			Dir: actors.NewHoldTable(time.Minute, nil), Log: slog.New(slog.DiscardHandler), Metrics: &actors.Metrics{},
			ReadSlack: time.Second, Notify: func(*messages.BlocksFreed) {},
		}
		table, err := sys.Root.SpawnNamed(actors.HoldSupervisorProps(deps), "holds")
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		got := measure(n, func(n int) any {
			for i := 0; i < n; i++ {
				ids := make([]uint32, perHold)
				first := uint32(i*perHold) % l.Blocks
				for j := range ids {
					ids[j] = first + uint32(j)
				}
				m, release, err := regions.Acquire("e", "r")
				if err != nil {
					b.Fatal(err)
				}
				if m != mapped {
					b.Fatal("another region")
				}
				req := &messages.CreateHoldRequest{EngineId: "e", RegionId: "r", BlockIds: ids, NumTokens: perHold * l.BlockSize}
				res, err := sys.Root.RequestFuture(table, &actors.CreateHold{
					ID: actors.NewTransferID(), Req: req, Region: m, ReleaseRegion: release,
					Lease: lease.Config{Retain: time.Hour, Mode: lease.OnFinish, Owner: "e"},
				}, 10*time.Second).Result()
				if err != nil {
					b.Fatalf("hold %d: %v", i, err)
				}
				if rep := res.(actors.Reply); rep.Err != nil {
					b.Fatalf("hold %d: %v", i, rep.Err)
				}
			}
			return nil
		})
		took := time.Since(start)
		if f := os.Getenv("BENCH_HOLDS_HEAPPROFILE"); f != "" {
			writeHeapProfile(b, f)
		}
		if live := deps.Dir.Live(); live != n {
			b.Fatalf("%d live holds, want %d", live, n)
		}
		b.Logf("backend=%s: %d holds created in %s (%.1f µs each)", be.Name(), n, took.Round(time.Millisecond), float64(took.Microseconds())/float64(n))
		fmt.Printf("  per live hold: %.0f process RSS bytes = %.0f in Go heap spans (%.0f live Go heap bytes in %.1f objects) + %.0f outside the Go heap (the data plane's C memory); %.3f goroutines\n",
			got.rss, got.spans, got.heap, got.objects, got.rss-got.spans, got.goroutines)
		fmt.Printf("  reference, bare lease.Hold: %.0f Go heap bytes, %.1f heap objects\n", ref.heap, ref.objects)
		fmt.Printf("HOLDS holds=%d bytes_per_hold=%.0f goroutines_per_hold=%.3f heap_bytes_per_hold=%.0f vs_bare_lease=%.1f backend=%s\n",
			n, max(got.rss, got.heap), got.goroutines, got.heap, max(got.rss, got.heap)/ref.heap, be.Name())
		sys.Shutdown()
		_ = be.Close()
		regions.Close()
	}
}

// writeHeapProfile writes the live heap to file (go tool pprof
// -sample_index=inuse_space): where the bytes of the live holds are.
func writeHeapProfile(b *testing.B, file string) {
	runtime.GC()
	f, err := os.Create(file)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}

// cost is what n live things cost, each: live Go heap, Go heap spans in
// use (live objects and the free room in their spans), process RSS.
type cost struct{ heap, spans, rss, goroutines, objects float64 }

// measure runs make(n), keeps what it returns alive, and reports the
// growth per thing of live Go heap (after a GC), process RSS (after
// returning freed heap pages to the OS) and goroutines.
func measure(n int, make func(n int) any) cost {
	s0 := snapshot()
	keep := make(n)
	s1 := snapshot()
	runtime.KeepAlive(keep)
	f := float64(n)
	return cost{heap: float64(s1.heap-s0.heap) / f, spans: float64(s1.spans-s0.spans) / f, rss: float64(s1.rss-s0.rss) / f,
		goroutines: float64(s1.goroutines-s0.goroutines) / f, objects: float64(s1.objects-s0.objects) / f}
}

type memSnapshot struct{ heap, spans, objects, rss, goroutines int64 }

func snapshot() memSnapshot {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSnapshot{heap: int64(ms.HeapAlloc), spans: int64(ms.HeapInuse), objects: int64(ms.HeapObjects), rss: rssBytes(), goroutines: int64(runtime.NumGoroutine())}
}

// rssBytes is this process's resident set (VmRSS), 0 where /proc lacks it.
func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// newRegion creates a region as connexd's region.create does: memory the
// data plane allocates where it can (UCX posix shared memory), else a memfd.
func newRegion(b *testing.B, be transport.Backend, l kvmem.Layout) *kvmem.Region {
	if al, err := transport.Promised[transport.Allocator](be, "Allocate"); err == nil && be.Caps().Allocate {
		mem, err := al.Allocate(int(l.Size()))
		if err == nil {
			r, err := kvmem.NewRegion(mem.Path(), l, kvmem.MemoryAllocated(be.Name()), mem.Bytes(), mem.Free)
			if err == nil {
				regionfile.Populate(mem.Bytes()[:l.Size()])
				return r
			}
			_ = mem.Free()
		}
		b.Logf("data plane cannot allocate (%v): a memfd region", err)
	}
	r, err := regionfile.CreateMemfd("bench-holds", l)
	if err != nil {
		b.Fatal(err)
	}
	return r
}
