package e2e

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// BenchmarkPull measures the data plane end to end, in one process tree and
// one run (`make bench-pull`, i.e. -benchtime 1x):
//
//   - memcpy of the same bytes in the same geometry, single-threaded, from a
//     cold source (two source buffers alternate, each larger than any cache,
//     so a source is never cache-hot); the same on every core, and
//     stream-all-cores: memcopy.StreamUnfenced (KV blocks in pairs: StreamPairUnfenced) with a Fence per MiB
//     (non-temporal stores, as mapped UCX reads copy) on every core, the
//     ucx row's physical limit;
//   - ucx_perftest -t ucp_get at the same message size, with the UCX_TLS the
//     connex UCX backend uses, and with UCX_TLS=tcp: one 256 MiB GET, or
//     4096 GETs of 32 KiB with 16 outstanding (ucx_perftest re-reads one
//     buffer; at 32 KiB that buffer is cache-hot, so compare with care);
//   - connex pulls between two connexd OS processes (holder and reader, one
//     NATS server in this process):
//   - ucx: --backend ucx with its defaults, the holder engine's region
//     created by connexd (region.create: UCX POSIX shared memory), so the
//     reader reads one-sided from the holder's segment that UCX maps
//     (ucp_rkey_ptr), copying on every core;
//     the RATIO line's ucx figures and kvlayout use this row;
//   - ucx-checked: --backend ucx, the engine's own region file
//     (region.register): the holder-checked protocol, the default for
//     memory UCX did not allocate;
//   - ucx-onesided: the same with --ucx-reads onesided (process_vm_readv);
//   - tcp: --backend tcp, the engine's own region file.
//     Each: CreateHold, then StartPull, timed from the StartPull request to
//     the PullDone notice arriving here; the reader's PullDone.duration_us
//     is reported too. One untimed first pull (it pays the page-table
//     faults of both daemons' fresh mappings; shown as "first"), then
//     pullReps timed pulls; the table shows their median and best, ratios
//     use the median. The layouts alternate pull by pull, so that the
//     machine's drift weighs on each alike. Every pull is verified byte for
//     byte (outside the timing) against the holder's region, into a
//     destination pre-filled with 0xEE, and starts from scrubbed caches
//     (scrubCaches), as every timed memcpy does.
//
// Layouts:
//
//   - contig: 1 layer x 2 planes x 1 block of 128 MiB (256 MiB). A hold is
//     registered per layer and plane, so this is the most contiguous a hold
//     can be: two adjacent 128 MiB extents, two GetOps.
//   - kv: 32 layers x K,V x 32 KiB blocks; the hold is the 64 even-numbered
//     blocks of a 128-block region, in shuffled order, pulled into a shuffled
//     permutation of the reader's blocks 0..63: 4096 pieces of 32 KiB
//     (128 MiB) that nothing can coalesce. The puller reads each layer and
//     plane in ascending source order.
//   - contig128: like contig with the KV layout's 128 MiB, for the CONTEXT
//     line's kvlayout/contiguous-same-bytes (piece count alone, without the
//     per-pull fixed cost weighing twice on the smaller pull).
//   - fixed: 2 × 64 KiB, whose pull time (CONTEXT per-pull-fixed-ms) is
//     what a pull costs beyond moving its bytes, in the product's flow:
//     each pull has a hold of its own and its request.start before it
//     (untimed, then the destination readied and the caches scrubbed, as
//     an engine's next step would; benchRequest), so the reader's connexd
//     may have reserved the read (pull/reserve.go). Its BREAKDOWN line per
//     connex case says where that time goes, medians in ms and as a share
//     of the wall: start_rpc (StartPull's request/reply; it overlaps what
//     follows), nats_in_out (wall less PullDone.duration_us: StartPull in to
//     the puller's start, PullDone out to the engine), descriptors
//     (descriptors_us), read (read_us), pull_end (pull_end_us, when awaited)
//     and other (the hand-offs between them), and the references: a bare
//     NATS request/reply on the same server (bare_nats_rtt_ms, two hops), and
//     the NATS floor of a pull (nats_floor_ms): its four messages through two
//     relay processes that only pass them on (pull_bench_floor_test.go), one
//     chain run right after each small pull, scrubbed caches alike; then the
//     10th percentiles of both (the machine's other load weighs least on
//     them) and wall/nats_floor, the median of each pull over its own chain;
//     last the engine API's floor (api_floor_ms, its 10th percentile): the
//     two messages no pull through the NATS subject API avoids — pull.start
//     answered and pull.done sent by a relay at once — run after each chain,
//     and fixed_vs_api_floor, the wall's median over the API floor's median
//     (issue 46's goal: <= 1.5).
//     BENCH_PULL_LAYOUTS=fixed runs only those pulls. With
//     BENCH_PULL_API_LAYERS=1 an APILAYERS line follows each BREAKDOWN
//     line: a request answered at once by the bare relay, behind micro,
//     behind connexd's API layer in a process of its own, and by connexd
//     (pull_bench_layers_test.go), each run beside every fixed pull.
//
// BENCH_PULL_REPS replaces the number of timed pulls (15). With
// BENCH_PULL_PROFILE=DIR the reader connexd of each case serves Go's
// profiles (pprof_listen) and DIR/reader-<case>.pprof receives a CPU
// profile of it over the first BENCH_PULL_PROFILE_S seconds (10) of its
// timed pulls: what a pull costs connexd, with enough reps to outlast it
// (e.g. BENCH_PULL_LAYOUTS=fixed BENCH_PULL_REPS=5000).
//
// The last line printed is
// RATIO ucx/memcpy=<x> ucx/perftest=<y> tcp/ucxtcp=<z> kvlayout/contiguous=<w>.
func BenchmarkPull(b *testing.B) {
	layouts := benchPullLayouts()
	if only := os.Getenv("BENCH_PULL_LAYOUTS"); only != "" {
		// e.g. BENCH_PULL_LAYOUTS=fixed: only the BREAKDOWN pulls (RATIO's
		// figures then read n/a).
		layouts = slices.DeleteFunc(layouts, func(l benchPullLayout) bool { return !slices.Contains(strings.Split(only, ","), l.name) })
	}
	res := &pullResults{m: map[string]pullStat{}}
	tls := os.Getenv("UCX_TLS")
	if tls == "" {
		tls = "^cma,tcp" // ucx.SafeDefaultTLS, what connexd uses when UCX_TLS is unset
	}
	ucxBuilt := buildTags() == "ucx"
	_, perfErr := exec.LookPath("ucx_perftest")

	b.Run("memcpy", func(b *testing.B) { benchPullMemcpy(b, layouts, res, "memcpy", 1, false) })
	if n := runtime.GOMAXPROCS(0); n > 1 {
		b.Run("memcpy-all-cores", func(b *testing.B) { benchPullMemcpy(b, layouts, res, "memcpy-all-cores", n, false) })
	}
	b.Run("stream-all-cores", func(b *testing.B) {
		benchPullMemcpy(b, layouts, res, "stream-all-cores", runtime.GOMAXPROCS(0), true)
	})
	if perfErr == nil {
		b.Run("perftest", func(b *testing.B) { benchPullPerftest(b, layouts, res, "perftest", tls) })
		b.Run("perftest-tcp", func(b *testing.B) { benchPullPerftest(b, layouts, res, "perftest-tcp", "tcp") })
	}
	url := startNATS(b)
	res.natsRTT = bareNATSRoundTrip(b, url)
	res.floor = startNATSFloor(b, url)
	if ucxBuilt {
		b.Run("ucx", func(b *testing.B) { benchPullConnex(b, layouts, res, url, "ucx", "ucx", true) })
		b.Run("ucx-checked", func(b *testing.B) {
			benchPullConnex(b, layouts, res, url, "ucx-checked", "ucx", false, "--ucx-reads", "checked")
		})
		b.Run("ucx-onesided", func(b *testing.B) {
			benchPullConnex(b, layouts, res, url, "ucx-onesided", "ucx", false, "--ucx-reads", "onesided")
		})
	}
	b.Run("tcp", func(b *testing.B) { benchPullConnex(b, layouts, res, url, "tcp", "tcp", false) })

	fmt.Printf("\nPull throughput, GB/s = 1e9 bytes/s (connex: %d timed pulls after one untimed first pull; median and best of them)\n", pullReps())
	fmt.Printf("connex UCX rows and ucx_perftest use UCX_TLS=%q; ucx rows %s; ucx_perftest %s\n", tls,
		map[bool]string{true: "built (-tags ucx)", false: "skipped (built without -tags ucx)"}[ucxBuilt],
		map[bool]string{true: "found", false: "not found: perftest rows skipped"}[perfErr == nil])
	fmt.Printf("ucx = holder region created by connexd (region.create, UCX shared memory): one-sided copies from UCX's mapping\n")
	fmt.Printf("      of the holder's segment (ucp_rkey_ptr) on every core, no holder CPU;\n")
	fmt.Printf("ucx-checked = engine's own region file: the holder checks and copies every read (UCX active messages);\n")
	fmt.Printf("ucx-onesided = engine's own region file, --ucx-reads onesided: the reader copies with process_vm_readv.\n")
	fmt.Printf("RATIO's ucx figures and kvlayout use the ucx row.\n")
	fmt.Printf("first = the untimed first pull (the daemons fault in their fresh mappings of the regions)\n")
	fmt.Printf("%-20s %-9s %9s %9s %9s  %s\n", "case", "layout", "median", "best", "first", "notes")
	for _, c := range []string{"memcpy", "memcpy-all-cores", "stream-all-cores", "perftest", "ucx", "ucx/duration_us", "ucx-checked", "ucx-checked/duration_us", "ucx-onesided", "ucx-onesided/duration_us",
		"tcp", "tcp/duration_us", "perftest-tcp"} {
		for _, l := range layouts {
			s, ok := res.get(c, l.name)
			if !ok {
				continue
			}
			fmt.Printf("%-20s %-9s %9s %9s %9s  %s\n", c, l.name, gbps(s.median), gbps(s.best), gbps(s.first), s.note)
		}
	}
	ratio := func(a, ac, bc, bl string) string {
		x, ok1 := res.get(ac, a)
		y, ok2 := res.get(bc, bl)
		if !ok1 || !ok2 || y.median <= 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", x.median/y.median)
	}
	kvCase := "tcp"
	if ucxBuilt {
		kvCase = "ucx"
	}
	// Context for the RATIO line: the ucx row copies on every core (mapped
	// reads) with non-temporal stores, so stream-all-cores is its physical
	// limit in each layout; and a pull carries a fixed control-plane cost
	// (StartPull, descriptors, PullEnd, PullDone) that weighs more on the
	// 128 MiB KV pull than on the 256 MiB contiguous one.
	fixedMs := func(c string) string {
		s, ok := res.get(c, "fixed")
		if !ok || s.median <= 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", float64(2*64<<10)/s.median*1e3)
	}
	fmt.Printf("CONTEXT per-pull-fixed-ms=%s (ucx) %s (tcp)\n", fixedMs("ucx"), fixedMs("tcp"))
	for _, l := range res.breakdowns {
		fmt.Println(l)
	}
	fmt.Printf("CONTEXT ucx/memcpy-all-cores=%s ucx/stream-all-cores=%s|%s (contig|kv) kvlayout/contiguous-same-bytes=%s stream-kvlayout/stream-contiguous=%s memcpy-kvlayout/memcpy-contiguous=%s\n",
		ratio("contig", "ucx", "memcpy-all-cores", "contig"),
		ratio("contig", "ucx", "stream-all-cores", "contig"),
		ratio("kv", "ucx", "stream-all-cores", "kv"),
		ratio("kv", kvCase, kvCase, "contig128"),
		ratio("kv", "stream-all-cores", "stream-all-cores", "contig"),
		ratio("kv", "memcpy", "memcpy", "contig"))
	fmt.Printf("RATIO ucx/memcpy=%s ucx/perftest=%s tcp/ucxtcp=%s kvlayout/contiguous=%s\n",
		ratio("contig", "ucx", "memcpy", "contig"),
		ratio("contig", "ucx", "perftest", "contig"),
		ratio("contig", "tcp", "perftest-tcp", "contig"),
		ratio("kv", kvCase, kvCase, "contig"))
}

// pullReps is how many timed pulls each case makes (BENCH_PULL_REPS, 15 by
// default).
func pullReps() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_PULL_REPS")); err == nil && n > 0 {
		return n
	}
	return 15
}

// benchPullLayout is a region geometry plus the blocks held at the holder
// (src) and the blocks they are pulled into at the reader (dst).
type benchPullLayout struct {
	name     string
	l        kvmem.Layout
	src, dst []uint32
	context  bool // for the CONTEXT line only: no ucx_perftest run
	pullOnly bool // only connex pulls run it (no memcpy reference)
}

func benchPullLayouts() []benchPullLayout {
	contig := benchPullLayout{name: "contig",
		l:   kvmem.Layout{Layers: 1, Planes: 2, Blocks: 1, BlockBytes: 128 << 20, BlockSize: 16, TPSize: 1},
		src: []uint32{0}, dst: []uint32{0}}
	kv := benchPullLayout{name: "kv",
		l: kvmem.Layout{Layers: 32, Planes: 2, Blocks: 128, BlockBytes: 32 << 10, BlockSize: 16, TPSize: 1}}
	for _, p := range benchShuffle(64, 1) {
		kv.src = append(kv.src, uint32(2*p))
	}
	for _, p := range benchShuffle(64, 2) {
		kv.dst = append(kv.dst, uint32(p))
	}
	// contig128 has the KV layout's byte count in two extents: kv against
	// it isolates the piece count from the per-pull fixed cost (which
	// weighs twice as much on 128 MiB as on 256 MiB). Context only.
	contig128 := benchPullLayout{name: "contig128", context: true,
		l:   kvmem.Layout{Layers: 1, Planes: 2, Blocks: 1, BlockBytes: 64 << 20, BlockSize: 16, TPSize: 1},
		src: []uint32{0}, dst: []uint32{0}}
	// fixed is 2 × 64 KiB: its time is what a pull costs beyond its bytes
	// (control round trips, planning, connect). Context only.
	fixed := benchPullLayout{name: "fixed", context: true, pullOnly: true,
		l:   kvmem.Layout{Layers: 1, Planes: 2, Blocks: 1, BlockBytes: 64 << 10, BlockSize: 16, TPSize: 1},
		src: []uint32{0}, dst: []uint32{0}}
	return []benchPullLayout{contig, kv, contig128, fixed}
}

// bytes is the number of bytes one pull moves.
func (p benchPullLayout) bytes() int64 {
	return int64(p.l.Layers) * int64(p.l.Planes) * int64(len(p.src)) * int64(p.l.BlockBytes)
}

// pieces lists (src offset, dst offset) of every block copy, in the
// puller's order (layer, plane, then source block ascending).
func (p benchPullLayout) pieces() [][2]uint64 {
	var out [][2]uint64
	for layer := uint32(0); layer < p.l.Layers; layer++ {
		for pl := uint32(0); pl < p.l.Planes; pl++ {
			n := len(out)
			for i := range p.src {
				out = append(out, [2]uint64{p.l.Offset(layer, pl, p.src[i]), p.l.Offset(layer, pl, p.dst[i])})
			}
			slices.SortFunc(out[n:], func(a, b [2]uint64) int { return cmp.Compare(a[0], b[0]) })
		}
	}
	return out
}

func benchShuffle(n int, seed uint64) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := n - 1; i > 0; i-- {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		j := int(x % uint64(i+1))
		p[i], p[j] = p[j], p[i]
	}
	return p
}

// fillPattern writes a position-dependent pseudo-random pattern, so a
// misplaced block fails verification.
func fillPattern(buf []byte, seed uint64) {
	for i := 0; i+8 <= len(buf); i += 8 {
		z := seed + uint64(i)*0x9E3779B97F4A7C15
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		binary.LittleEndian.PutUint64(buf[i:], z^(z>>31))
	}
}

// scrubBytes is four times the last-level cache of the machine this bench
// was tuned on (32 MiB of L3).
const scrubBytes = 128 << 20

var (
	scrubBuf  []byte
	scrubSink uint64
)

// scrubCaches reads a scratch buffer larger than the last-level cache, one
// load per cache line, so that every timed copy or pull starts from caches
// that hold none of its bytes and no dirty lines: without it the 0xEE
// pre-fill of the destination (and the previous verification) leave up to
// an L3 of dirty or hot lines, whose write-back or hits weigh twice as much
// on the 128 MiB KV pull as on the 256 MiB contiguous one. An engine's KV
// blocks are not in the CPU cache when a pull starts either. Every core
// reads (a share of the buffer far larger than its private L2), so dirty
// lines in a core's own L2 (non-inclusive L3s keep them there) go too.
func scrubCaches() {
	if scrubBuf == nil {
		scrubBuf = make([]byte, scrubBytes)
		for i := range scrubBuf {
			scrubBuf[i] = byte(i)
		}
	}
	n := runtime.GOMAXPROCS(0)
	sums := make([]uint64, n)
	var wg sync.WaitGroup
	for c := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s uint64
			for i := c * 64; i < len(scrubBuf); i += 64 * n {
				s += uint64(scrubBuf[i])
			}
			sums[c] = s
		}()
	}
	wg.Wait()
	for _, s := range sums {
		scrubSink += s
	}
}

func fillByte(buf []byte, v byte) {
	if len(buf) == 0 {
		return
	}
	buf[0] = v
	for n := 1; n < len(buf); n *= 2 {
		copy(buf[n:], buf[:n])
	}
}

type pullStat struct {
	median, best, first float64 // bytes/s; first 0 when not applicable
	note                string
}

type pullResults struct {
	mu sync.Mutex
	m  map[string]pullStat
	// breakdowns are the BREAKDOWN lines, one per connex case, each
	// followed by its APILAYERS line when the layer probes ran.
	breakdowns []string
	// natsRTT is the median bare NATS request/reply between two
	// connections of this process, on the same server: the reference for
	// the NATS hops in a BREAKDOWN line.
	natsRTT time.Duration
	// floor runs a pull's four NATS messages through two relay processes
	// that do nothing else (pull_bench_floor_test.go), once beside every
	// small pull: what a pull's fixed cost cannot go under on this machine.
	floor *natsFloor
}

// benchRequest readies one "fixed" pull as the product flow does before
// pull.start: the prefill engine pe holds the blocks (hold.create, a hold
// per pull, so that each request binds its own), and the decode engine de
// starts the request (request.start, which its connexd answers before it
// asks the holder for the hold's descriptors). It returns the pull's
// params (connex_request_id set, as an engine sends them) and finish, the
// request's request.finish (which releases the hold).
func benchRequest(b *testing.B, pe, de *engine, l benchPullLayout, id string) (*messages.KVTransferParams, func()) {
	b.Helper()
	n := uint32(len(l.src)) * l.l.BlockSize
	hold, err := pe.cli.CreateHold(ctx5(b), &messages.CreateHoldRequest{EngineId: pe.id, RegionId: pe.rid, BlockIds: l.src, NumTokens: n, Consumer: de.id})
	if err != nil {
		b.Fatalf("pull %s: create hold: %v", id, err)
	}
	prm := proto.CloneOf(hold.Params)
	prm.ConnexRequestId = "r-" + id
	st, err := de.cli.StartRequest(ctx5(b), &messages.StartRequestMsg{RequestId: prm.ConnexRequestId, Params: prm, PromptTokenIds: prompt(int(n)), EngineId: de.id, ResumeAuthority: "router"})
	if err != nil {
		b.Fatalf("pull %s: request.start: %v", id, err)
	}
	return prm, func() {
		if _, err := de.cli.FinishRequest(ctx5(b), &messages.FinishRequestMsg{RequestId: prm.ConnexRequestId, Epoch: st.GetState().GetEpoch()}); err != nil {
			b.Fatalf("pull %s: request.finish: %v", id, err)
		}
	}
}

func (r *pullResults) put(c, l string, s pullStat) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[c+" "+l] = s
}

func (r *pullResults) get(c, l string) (pullStat, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.m[c+" "+l]
	return s, ok
}

func gbps(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", v/1e9)
}

// statOf turns durations of n-byte moves into a pullStat.
func statOf(n int64, ds []time.Duration) pullStat {
	s := slices.Clone(ds)
	slices.Sort(s)
	return pullStat{median: float64(n) / s[len(s)/2].Seconds(), best: float64(n) / s[0].Seconds()}
}

type pullNotice struct {
	d  *messages.PullDone
	at time.Time
}

// benchPullConnex starts a holder and a reader connexd with --backend
// backend (plus extra flags) and pulls each layout once untimed, then
// pullReps times timed; results are stored under name. With created, the
// holder engine's region is created by connexd (region.create), else it is
// the engine's own file (region.register).
func benchPullConnex(b *testing.B, layouts []benchPullLayout, res *pullResults, url, name, backend string, created bool, extra ...string) {
	b.StopTimer()
	// pull_stall_ms is raised from its 1 s default because the untimed first
	// pull into freshly mapped regions pays a page fault per 4 KiB page in
	// both daemons, and the stall deadline covers a whole Get batch, which for
	// the contiguous layout is one 128 MiB extent. It never fires in a
	// healthy pull, so it does not change the timed figures.
	args := append([]string{"--backend", backend, "--nats-url", url, "--log-level", "warn", "--pull-stall-ms", "10000"}, extra...)
	hn := startConnexd(b, "holder-"+name, args...)
	profDir := os.Getenv("BENCH_PULL_PROFILE")
	rargs := args
	if profDir != "" {
		rargs = append(slices.Clone(args), "--pprof-listen", "127.0.0.1:0")
	}
	rn := startConnexd(b, "reader-"+name, rargs...)
	nc := connect(b, url)
	// One case per layout, set up first; the pulls then alternate between
	// the layouts rep by rep, so that the machine's drift (this kind of VM
	// changes speed by tens of percent within a minute) weighs on every
	// layout alike and the kvlayout ratio compares like with like.
	type pullCase struct {
		l          benchPullLayout
		pe, de     *engine
		hold       *messages.CreateHoldReply
		notes      chan pullNotice
		walls      []time.Duration
		durs       []time.Duration
		phases     []pullPhases
		layers     []apiLayers
		first      time.Duration
		hcpu, rcpu time.Duration
	}
	var cases []*pullCase
	for _, l := range layouts {
		c := &pullCase{l: l, notes: make(chan pullNotice, 64)}
		if created {
			c.pe, _ = newCreatedEngine(b, nc, hn.member, "P"+name+l.name, l.l, false)
		} else {
			c.pe = newEngine(b, nc, hn.member, "P"+name+l.name, l.l, false)
		}
		c.de = newEngine(b, nc, rn.member, "D"+name+l.name, l.l, false)
		fillPattern(c.pe.region.Bytes(), uint64(len(l.name)))
		sub, err := nc.Subscribe(api.PullDoneSubject(c.de.cli.Member, c.de.id), func(m *nats.Msg) {
			at := time.Now()
			v := new(messages.PullDone)
			if proto.Unmarshal(m.Data, v) == nil {
				c.notes <- pullNotice{v, at}
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := nc.Flush(); err != nil {
			b.Fatal(err)
		}
		c.hold, err = c.pe.cli.CreateHold(ctx5(b), &messages.CreateHoldRequest{EngineId: c.pe.id, RegionId: c.pe.rid, BlockIds: l.src, NumTokens: uint32(len(l.src)) * l.l.BlockSize, Consumer: c.de.id})
		if err != nil {
			b.Fatalf("%s %s: create hold: %v", name, l.name, err)
		}
		cases = append(cases, c)
	}
	var total int64
	stopProfile := func() {}
	if profDir != "" {
		secs, _ := strconv.Atoi(cmp.Or(os.Getenv("BENCH_PULL_PROFILE_S"), "10"))
		stopProfile = profileCPU(b, rn.pprofURL, filepath.Join(profDir, "reader-"+name+".pprof"), max(secs, 1))
	}
	for i := 0; i <= max(pullReps(), b.N); i++ {
		for _, c := range cases {
			l, pe, de := c.l, c.pe, c.de
			for j := range l.dst {
				for layer := uint32(0); layer < l.l.Layers; layer++ {
					for p := uint32(0); p < l.l.Planes; p++ {
						fillByte(de.region.Block(layer, p, l.dst[j]), 0xEE)
					}
				}
			}
			id := fmt.Sprintf("%s-%s-%d", name, l.name, i)
			params := c.hold.Params
			var finish func()
			if l.name == "fixed" {
				// The product flow (untimed): a hold of its own, then
				// the decode engine's request.start, then — after the
				// destination is readied, as an engine's next step
				// would — the timed pull.start of the same transfer.
				params, finish = benchRequest(b, c.pe, c.de, l, id)
			}
			scrubCaches()
			h0, r0 := procCPU(hn.cmd.Process.Pid), procCPU(rn.cmd.Process.Pid)
			if i > 0 {
				b.StartTimer()
			}
			t0 := time.Now()
			start := &messages.StartPullRequest{Params: params, EngineId: de.id, RegionId: de.rid, BlockIds: l.dst, PullId: id}
			if _, err := de.cli.StartPull(ctx5(b), start); err != nil {
				b.Fatalf("start pull %s: %v", id, err)
			}
			startRPC := time.Since(t0)
			var n pullNotice
			timeout := time.NewTimer(60 * time.Second)
			for n.d == nil {
				select {
				case x := <-c.notes:
					if x.d.PullId == id {
						n = x
					} else if apiLayersOn() {
						// The layer probes' repeated pull.starts must
						// start nothing.
						b.Fatalf("pull %s: a PullDone of pull %s, which had ended: %v", id, x.d.PullId, x.d)
					}
				case <-timeout.C:
					b.Fatalf("pull %s: no PullDone within 60s\nholder:\n%s\nreader:\n%s", id, hn.logs(), rn.logs())
				}
			}
			timeout.Stop()
			wall := n.at.Sub(t0)
			b.StopTimer()
			if !n.d.Ok || int64(n.d.Bytes) != l.bytes() {
				b.Fatalf("pull %s: %v", id, n.d)
			}
			if finish != nil {
				finish()
			}
			if i == 0 {
				c.first = wall
			} else {
				c.walls = append(c.walls, wall)
				c.durs = append(c.durs, time.Duration(n.d.DurationUs)*time.Microsecond)
				c.phases = append(c.phases, phasesOf(wall, startRPC, n.d))
				c.hcpu += procCPU(hn.cmd.Process.Pid) - h0
				c.rcpu += procCPU(rn.cmd.Process.Pid) - r0
				total += l.bytes()
			}
			if i > 0 && l.name == "fixed" {
				c.phases[len(c.phases)-1].floor = res.floor.chain(b)
				c.phases[len(c.phases)-1].apiFloor = res.floor.apiChain(b)
			}
			if l.name == "fixed" && apiLayersOn() {
				// After the floor chains; the untimed first pull's round
				// warms the relays up.
				if lay := probeAPILayers(b, de.cli, start); i > 0 {
					c.layers = append(c.layers, lay)
				}
			}
			for layer := uint32(0); layer < l.l.Layers; layer++ {
				for p := uint32(0); p < l.l.Planes; p++ {
					for j := range l.src {
						if !bytes.Equal(pe.region.Block(layer, p, l.src[j]), de.region.Block(layer, p, l.dst[j])) {
							b.Fatalf("pull %s: layer %d plane %d: dst block %d differs from src block %d", id, layer, p, l.dst[j], l.src[j])
						}
					}
				}
			}
		}
	}
	stopProfile()
	for _, c := range cases {
		l := c.l
		rel := &api.Client{NC: nc, Member: c.hold.Params.RemoteCtrl.GetMember()}
		// The fixed pulls each pull a hold of their own (benchRequest):
		// the case's is never claimed, and in a long run (BENCH_PULL_REPS)
		// its claim_s ends it first.
		if _, err := rel.Release(ctx5(b), &messages.HoldRef{TransferId: c.hold.Params.TransferId, Requester: c.de.id}); err != nil &&
			(l.name != "fixed" || api.CodeOf(err) != api.CodeExpired) {
			b.Fatalf("release: %v", err)
		}
		s := statOf(l.bytes(), c.walls)
		s.first = float64(l.bytes()) / c.first.Seconds()
		gb := float64(l.bytes()*int64(len(c.walls))) / 1e9
		s.note = fmt.Sprintf("StartPull→PullDone, %d GetOps; CPU (incl. polling) per GB: holder %.0f ms, reader %.0f ms; verified",
			len(l.pieces()), float64(c.hcpu.Milliseconds())/gb, float64(c.rcpu.Milliseconds())/gb)
		res.put(name, l.name, s)
		ds := statOf(l.bytes(), c.durs)
		ds.note = "reader-side PullDone.duration_us (descriptors + connect + GETs)"
		res.put(name+"/duration_us", l.name, ds)
		if l.name == "fixed" {
			res.breakdowns = append(res.breakdowns, breakdownLine(name, c.phases, res.natsRTT))
			if line := apiLayersLine(name, c.layers); line != "" {
				res.breakdowns = append(res.breakdowns, line)
			}
		}
	}
	b.SetBytes(total / int64(b.N))
	hn.stop()
	rn.stop()
}
