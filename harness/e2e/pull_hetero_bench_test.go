package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/kvfill"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// heteroShape is an engine's KV shape in BenchmarkPullHetero: a
// Llama-3-8B-shaped model (32 layers, 8 KV heads of 128 bfloat16
// elements: 2 KiB per token per layer and plane, 32 KiB blocks of 16
// tokens at TP 1).
type heteroShape struct {
	order  string
	tp, bs uint32
}

func (s heteroShape) layout(rank, blocks uint32) kvmem.Layout {
	return describedLayout("bench-llama3-8b", 32, 8, 128, s.order, s.tp, rank, s.bs, blocks)
}

// heteroCase is one pull shape of BenchmarkPullHetero.
type heteroCase struct {
	name         string
	holder, read heteroShape
}

// BenchmarkPullHetero measures pulls between engines of different shapes
// against the homogeneous pull of the same bytes, in one run (`make
// bench-pull`): 1024 tokens of KV (128 MiB), held in 64 scattered blocks
// of 16 tokens (shuffled, as BenchmarkPull's kv layout), pulled into
// scattered reader blocks. Cases: homogeneous (whole blocks, NHD and the
// CPU order), a TP 2 holder read by a TP 1 reader (NHD: a piece per token
// and rank, 1 KiB; HND and the CPU order: half a block per rank), and a
// block-size change 16 → 32 (NHD: whole source blocks regrouped by the
// reads; the CPU order: staged, regrouped by the puller on arrival). Per data plane (ucx with
// created regions when built, and tcp) one untimed first pull then
// heteroReps timed ones, the cases alternating rep by rep (each rep from
// the next case on); the first and
// last pull of every case are verified element by element (kvfill).
// Prints a table and, last for the default data plane,
// HETERO tp_vs_homogeneous=<r> block_size_vs_homogeneous=<r> … (medians;
// goal ≥ 0.8 each): tp is the HND pull, NHD's is tp_nhd_vs_homogeneous.
//
// BENCH_HETERO_CASES=a,b runs only the named cases (the homogeneous ones
// are always run: the ratios need them; the HETERO line then says "-" for
// a ratio whose case did not run); BENCH_HETERO_REPS sets the timed pulls
// per case (heteroReps); BENCH_PULL_PROFILE=DIR writes a CPU profile of
// each backend's reader and holder connexds over the first BENCH_PULL_PROFILE_S
// seconds (10) of its timed pulls, as BenchmarkPull does.
func BenchmarkPullHetero(b *testing.B) {
	if only := os.Getenv("BENCH_PULL_LAYOUTS"); only != "" && !slices.Contains(strings.Split(only, ","), "hetero") {
		b.Skip("BENCH_PULL_LAYOUTS does not name hetero")
	}
	nhd1 := heteroShape{kvmem.OrderNHD, 1, 16}
	cases := []heteroCase{
		{"homogeneous", nhd1, nhd1},
		{"tp2->1", heteroShape{kvmem.OrderNHD, 2, 16}, nhd1},
		{"tp2->1-hnd", heteroShape{kvmem.OrderHND, 2, 16}, heteroShape{kvmem.OrderHND, 1, 16}},
		{"bs16->32", nhd1, heteroShape{kvmem.OrderNHD, 1, 32}},
		{"cpu-homogeneous", heteroShape{kvmem.OrderCPU, 1, 16}, heteroShape{kvmem.OrderCPU, 1, 16}},
		{"cpu-tp2->1", heteroShape{kvmem.OrderCPU, 2, 16}, heteroShape{kvmem.OrderCPU, 1, 16}},
		{"cpu-bs16->32", heteroShape{kvmem.OrderCPU, 1, 16}, heteroShape{kvmem.OrderCPU, 1, 32}},
	}
	if only := os.Getenv("BENCH_HETERO_CASES"); only != "" {
		names := strings.Split(only, ",")
		cases = slices.DeleteFunc(cases, func(c heteroCase) bool {
			return !strings.HasSuffix(c.name, "homogeneous") && !slices.Contains(names, c.name)
		})
	}
	url := startNATS(b)
	backends := []string{"tcp"}
	if buildTags() == "ucx" {
		backends = append(backends, "ucx") // the default data plane last: its HETERO line is the last
	}
	for _, backend := range backends {
		b.Run(backend, func(b *testing.B) { benchHetero(b, url, backend, cases) })
	}
}

// heteroReps is the timed pulls of each case by default
// (BENCH_HETERO_REPS).
const heteroReps = 9

func benchHetero(b *testing.B, url, backend string, cases []heteroCase) {
	b.StopTimer()
	// claim_s off and a long retain_s: filling and verifying the cases
	// take longer than a hold waits for its first pull (15 s) or between
	// two (60 s) by default, on a busy machine.
	args := []string{"--backend", backend, "--nats-url", url, "--log-level", "warn", "--pull-stall-ms", "10000", "--claim-s", "0", "--retain-s", "3600"}
	profDir := os.Getenv("BENCH_PULL_PROFILE")
	if profDir != "" {
		args = append(args, "--pprof-listen", "127.0.0.1:0")
	}
	hn := startConnexd(b, "hholder-"+backend, args...)
	rn := startConnexd(b, "hreader-"+backend, args...)
	reps := envInt("BENCH_HETERO_REPS", heteroReps)
	nc := connect(b, url)
	const tokens = 1024
	type run struct {
		c       heteroCase
		holdIDs []uint32
		dstIDs  []uint32
		region  *kvmem.Region
		holdReq *messages.CreateHoldRequest
		hold    *messages.CreateHoldReply
		did     string
		notes   chan *messages.PullDone
		walls   []time.Duration
		reads   []time.Duration
		bytes   uint64
	}
	var runs []*run
	for i, c := range cases {
		r := &run{c: c, notes: make(chan *messages.PullDone, 16)}
		for _, p := range benchShuffle(tokens/int(c.holder.bs), uint64(3+i)) {
			r.holdIDs = append(r.holdIDs, uint32(2*p))
		}
		pid, did := fmt.Sprintf("HP%d%s", i, backend), fmt.Sprintf("HD%d%s", i, backend)
		var rankIDs []string
		for rank := range c.holder.tp {
			l := c.holder.layout(rank, 2*uint32(len(r.holdIDs)))
			kvfill.Fill(l, rankRegion(b, nc, hn.member, pid, l).Bytes(), r.holdIDs)
			if rank > 0 {
				rankIDs = append(rankIDs, fmt.Sprintf("r%d", rank))
			}
		}
		r.holdReq = &messages.CreateHoldRequest{EngineId: pid, RegionId: "r0", RankRegionIds: rankIDs, BlockIds: r.holdIDs, NumTokens: tokens}
		_, nDst, err := kvmem.PullSize(c.holder.bs, len(r.holdIDs), tokens, c.read.bs)
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range benchShuffle(nDst, uint64(50+i)) {
			r.dstIDs = append(r.dstIDs, uint32(p))
		}
		r.did = did
		r.region = rankRegion(b, nc, rn.member, did, c.read.layout(0, uint32(nDst)))
		sub, err := nc.Subscribe(api.PullDoneSubject(rn.member, did), func(m *nats.Msg) {
			v := new(messages.PullDone)
			if proto.Unmarshal(m.Data, v) == nil {
				r.notes <- v
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		runs = append(runs, r)
	}
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	for _, r := range runs {
		var err error
		if r.hold, err = (&api.Client{NC: nc, Member: hn.member}).CreateHold(ctx5(b), r.holdReq); err != nil {
			b.Fatalf("%s: hold: %v", r.c.name, err)
		}
	}
	dcli := &api.Client{NC: nc, Member: rn.member}
	stopProfile := func() {}
	if profDir != "" {
		secs := max(envInt("BENCH_PULL_PROFILE_S", 10), 1)
		stopReader := profileCPU(b, rn.pprofURL, filepath.Join(profDir, "hreader-"+backend+".pprof"), secs)
		stopHolder := profileCPU(b, hn.pprofURL, filepath.Join(profDir, "hholder-"+backend+".pprof"), secs)
		stopProfile = func() { stopReader(); stopHolder() }
	}
	for i := 0; i <= reps; i++ {
		// Each rep starts at another case: what a pull leaves behind (the
		// collector's work, the copiers' caches) then weighs on every case
		// alike, not always on the one after the same neighbour.
		for j := range runs {
			r := runs[(i+j)%len(runs)]
			fillByte(r.region.Bytes(), 0)
			scrubCaches()
			id := fmt.Sprintf("%s-%d", r.did, i)
			t0 := time.Now()
			if _, err := dcli.StartPull(ctx5(b), &messages.StartPullRequest{Params: r.hold.Params, EngineId: r.did, RegionId: "r0", BlockIds: r.dstIDs, PullId: id}); err != nil {
				b.Fatalf("%s: start pull: %v", r.c.name, err)
			}
			var d *messages.PullDone
			select {
			case d = <-r.notes:
			case <-time.After(60 * time.Second):
				b.Fatalf("%s: no PullDone within 60 s", r.c.name)
			}
			wall := time.Since(t0)
			if !d.Ok {
				b.Fatalf("%s: pull failed: %s", r.c.name, d.Error)
			}
			if i == 0 || i == reps {
				if err := kvfill.Check(r.region.Layout, r.region.Bytes(), r.dstIDs, tokens, true); err != nil {
					b.Fatalf("%s pull %d: %v", r.c.name, i, err)
				}
			}
			if i > 0 {
				r.walls = append(r.walls, wall)
				r.reads = append(r.reads, time.Duration(d.ReadUs)*time.Microsecond)
				r.bytes = d.Bytes
			}
		}
	}
	stopProfile()
	median := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	fmt.Printf("\nPulls between engine shapes, %s data plane (1024 tokens, 128 MiB of Llama-3-8B-shaped KV; medians of %d; GB/s = 1e9 B/s)\n", backend, reps)
	fmt.Printf("%-16s %-28s %-28s %9s %9s %9s  %s\n", "case", "holder", "reader", "GB/s", "wall_ms", "read_ms", "vs homogeneous")
	wall := map[string]time.Duration{}
	for _, r := range runs {
		w, rd := median(r.walls), median(r.reads)
		wall[r.c.name] = w
		ref := wall["homogeneous"]
		if r.c.holder.order == kvmem.OrderCPU {
			ref = wall["cpu-homogeneous"]
		}
		fmt.Printf("%-16s %-28s %-28s %9.2f %9.2f %9.2f  %.2f\n", r.c.name,
			fmt.Sprintf("%s tp%d bs%d", r.c.holder.order, r.c.holder.tp, r.c.holder.bs), fmt.Sprintf("%s tp%d bs%d", r.c.read.order, r.c.read.tp, r.c.read.bs),
			float64(r.bytes)/w.Seconds()/1e9, float64(w)/1e6, float64(rd)/1e6, float64(ref)/float64(w))
	}
	vs := func(c, ref string) string {
		if wall[c] == 0 {
			return "-" // not run (BENCH_HETERO_CASES)
		}
		return fmt.Sprintf("%.2f", float64(wall[ref])/float64(wall[c]))
	}
	// tp_vs_homogeneous is the HND pull: between TP sizes a rank's heads
	// are then half a block, as in the CPU order (cpu_tp); NHD interleaves
	// the heads of every token, so its pull is a 1 KiB piece per token and
	// rank (tp_nhd, reported beside it).
	fmt.Printf("HETERO tp_vs_homogeneous=%s block_size_vs_homogeneous=%s tp_nhd_vs_homogeneous=%s cpu_tp_vs_cpu_homogeneous=%s cpu_regroup_vs_cpu_homogeneous=%s backend=%s\n",
		vs("tp2->1-hnd", "homogeneous"), vs("bs16->32", "homogeneous"), vs("tp2->1", "homogeneous"), vs("cpu-tp2->1", "cpu-homogeneous"), vs("cpu-bs16->32", "cpu-homogeneous"), backend)
	hn.stop()
	rn.stop()
}
