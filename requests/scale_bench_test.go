package requests

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// BenchmarkScale (make bench-scale) drives many requests through the
// request store of one decode member, as connexd does (create, one
// progress checkpoint, finish), while that member's orphan coordinator
// scans the store every second (orphan_scan_ms' default), against an
// embedded NATS server with JetStream in this process. It prints the CPU
// per request (this process: server and client) over the first and the
// last window of requests, and the idle CPU before and after them, and
// ends with the SCALE line. A store whose scan replays finished requests
// costs more per request and more at idle the more requests went through.
// BENCH_SCALE_REQUESTS sets the number of requests (default 100000; the
// window is 10000, or a quarter of fewer), BENCH_SCALE_IDLE_S the seconds
// of each idle measurement (default 10).
func BenchmarkScale(b *testing.B) {
	total := envInt(b, "BENCH_SCALE_REQUESTS", 100_000)
	idleSeconds := envInt(b, "BENCH_SCALE_IDLE_S", 10)
	window := min(10_000, total/4)
	if window < 1 {
		b.Fatalf("BENCH_SCALE_REQUESTS=%d: want at least 4", total)
	}
	for range b.N {
		srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: b.TempDir(), NoLog: true, NoSigs: true})
		if err != nil {
			b.Fatal(err)
		}
		go srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			b.Fatal("embedded NATS not ready")
		}
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		store, err := OpenKVStore(ctx, nc, 1, time.Hour, 1<<30) // request_ttl_s, request_store_bytes defaults
		if err != nil {
			b.Fatal(err)
		}
		members := &fakeMembers{
			live: []Candidate{{"d1", 0}},
			view: View{Present: map[string]bool{"d1": true}, Settled: map[string]bool{"d1": true}, Watched: time.Hour, Grace: time.Second},
		}
		var scans atomic.Int64
		coord := &Coordinator{
			Self: "d1", Members: members,
			Owners: func(ctx context.Context) (map[string]string, error) {
				scans.Add(1)
				return store.Owners(ctx)
			},
			Adopt:     func(context.Context, Adoption) error { return nil },
			AdoptHere: func(context.Context, string, string) error { return nil },
			Running:   func(string) bool { return true }, // every request runs here
			Interval:  time.Second,
			Log:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			coord.Run(stop)
		}()

		msgs := func() int64 {
			v, err := srv.Varz(nil)
			if err != nil {
				b.Fatal(err)
			}
			return v.InMsgs + v.OutMsgs
		}
		before := idleCPU(idleSeconds, msgs)
		var windows []phase
		for from := 0; from < total; from += window {
			windows = append(windows, drive(b, ctx, store, from, min(from+window, total), msgs))
		}
		first, last := windows[0], windows[len(windows)-1]
		after := idleCPU(idleSeconds, msgs)

		close(stop)
		<-done
		status, err := store.KV.Status(ctx)
		if err != nil {
			b.Fatal(err)
		}
		cancel()
		nc.Close()
		srv.Shutdown()

		perFirst, perLast := first.cpu/time.Duration(first.n), last.cpu/time.Duration(last.n)
		fmt.Printf("scale: %d requests (create, 1 progress, finish; 16 at a time), orphan scan every %v (%d scans), this process's CPU (embedded NATS + store)\n",
			total, coord.Interval, scans.Load())
		fmt.Printf("  by %d requests, µs CPU per request:", window)
		for _, w := range windows {
			fmt.Printf(" %.0f", micros(w.cpu/time.Duration(w.n)))
		}
		fmt.Printf("\n  by %d requests, NATS messages per request (server in + out):", window)
		for _, w := range windows {
			fmt.Printf(" %.1f", float64(w.msgs)/float64(w.n))
		}
		fmt.Println()
		fmt.Printf("  first %d: %v wall, %.1f µs CPU per request\n", first.n, first.wall.Round(time.Millisecond), micros(perFirst))
		fmt.Printf("  last %d:  %v wall, %.1f µs CPU per request\n", last.n, last.wall.Round(time.Millisecond), micros(perLast))
		fmt.Printf("  idle before, ms CPU per s: %v (median %.2f)\n", before.samples, before.median)
		fmt.Printf("  idle after,  ms CPU per s: %v (median %.2f)\n", after.samples, after.median)
		fmt.Printf("  idle NATS messages per s: before %.1f, after %.1f\n", before.msgsPerSecond, after.msgsPerSecond)
		fmt.Printf("  bucket after: %d messages\n", status.Values())
		fmt.Printf("SCALE cpu_per_req_ratio_last_vs_first=%.3f idle_cpu_after_vs_before=%.3f\n",
			float64(perLast)/float64(perFirst), after.median/before.median)
	}
}

// phase is the wall and CPU time of n requests, and the messages the
// NATS server handled meanwhile.
type phase struct {
	n         int
	wall, cpu time.Duration
	msgs      int64
}

// drive runs requests from..to-1 through store, 16 at a time: create, one
// progress checkpoint, finish. msgs counts the server's messages.
func drive(b testing.TB, ctx context.Context, store *KVStore, from, to int, msgs func() int64) phase {
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		failOnce sync.Once
		failed   error
	)
	next.Store(int64(from))
	t0, c0, m0 := time.Now(), processCPU(), msgs()
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(to); i = next.Add(1) - 1 {
				if err := oneRequest(ctx, store, i); err != nil {
					failOnce.Do(func() { failed = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if failed != nil {
		b.Fatal(failed)
	}
	return phase{n: to - from, wall: time.Since(t0), cpu: processCPU() - c0, msgs: msgs() - m0}
}

// oneRequest is request i's life in the store as a request actor lives it.
func oneRequest(ctx context.Context, store *KVStore, i int64) error {
	m := start()
	m.RequestId = "scale-" + strconv.FormatInt(i, 10)
	now := time.Now()
	st, err := New(m, "d1", now)
	if err != nil {
		return err
	}
	rev, err := store.Create(ctx, st)
	if err != nil {
		return err
	}
	next, err := Append(st, st.Epoch, []uint32{5, 6, 7, 8, 9, 10, 11, 12}, now)
	if err != nil {
		return err
	}
	if rev, err = store.Update(ctx, next, rev, PromptChanged(st, next)); err != nil {
		return err
	}
	return store.Delete(ctx, st.RequestId, rev)
}

// idle is CPU use over 1 s samples, in ms of CPU per s; the median keeps
// a rare background flush, or a second without a scan, from deciding the
// figure.
type idle struct {
	samples       []float64
	median        float64
	msgsPerSecond float64 // NATS server messages, over all samples
}

func idleCPU(seconds int, msgs func() int64) idle {
	// Neither the garbage the requests left nor the runtime handing its
	// pages back to the OS afterwards (the scavenger) counts as idle cost.
	debug.FreeOSMemory()
	time.Sleep(time.Second) // settling, not waiting for a condition
	var out idle
	m0, start := msgs(), time.Now()
	for range seconds {
		c0, t0 := processCPU(), time.Now()
		time.Sleep(time.Second) // measuring a second of idleness, not waiting for a condition
		out.samples = append(out.samples, float64((processCPU()-c0).Microseconds())/1000/time.Since(t0).Seconds())
	}
	out.msgsPerSecond = float64(msgs()-m0) / time.Since(start).Seconds()
	sorted := slices.Sorted(slices.Values(out.samples))
	out.median = sorted[len(sorted)/2]
	for i, s := range out.samples {
		out.samples[i] = float64(int(s*100)) / 100
	}
	return out
}

// processCPU returns the user+system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }

// envInt reads a positive integer from the environment, or def.
func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}
