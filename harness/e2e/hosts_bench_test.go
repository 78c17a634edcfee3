package e2e

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// hostsBenchReps is how many timed pulls (and iperf3 runs) the HOSTS
// figures are the median of.
const hostsBenchReps = 7

// BenchmarkHosts (make bench-hosts) measures a TCP-data-plane pull from a
// prefill member on one netlab host to a decode member on another, and
// iperf3 between the same two addresses in the same run, alternating the
// two so that the machine's drift weighs on both alike. It prints
//
//	HOSTS tcp_pull_gbps=<a> iperf3_gbps=<b> ratio=<a/b>
//
// with medians of hostsBenchReps runs each (goal: ratio >= 0.7). A pull is
// StartPull to PullDone of 128 MiB in 2048 pieces of 64 KiB (32 blocks of
// a 32-layer KV cache), verified; iperf3 runs two TCP streams for 2 s, as
// many as the TCP data plane opens to a peer (ConnsPerEndpoint).
func BenchmarkHosts(b *testing.B) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		b.Skip("iperf3 not installed (apt-get install iperf3): the HOSTS reference needs it")
	}
	l := newHostLab(b, 2)
	h1, h2 := l.lab.Hosts[0], l.lab.Hosts[1]
	args := []string{"--js-replicas", "1", "--log-level", "warn", "--pull-stall-ms", "10000"}
	p := l.connexd(h1, "p1", append(args, "--role", "prefill")...)
	d := l.connexd(h2, "d2", append(args, "--role", "decode")...)
	nc1, nc2 := l.conn(h1), l.conn(h2)
	layout := kvmem.Layout{Layers: 32, Planes: 2, Blocks: 64, BlockBytes: 64 << 10, BlockSize: 16, TPSize: 1}
	pe := newEngine(b, nc1, p.member, "engP", layout, true)
	de := newEngine(b, nc2, d.member, "engD", layout, false)
	blocks := make([]uint32, 32)
	for i := range blocks {
		blocks[i] = uint32(2 * i)
	}
	hold, err := pe.cli.CreateHold(ctx5(b), &messages.CreateHoldRequest{EngineId: pe.id, RegionId: pe.rid, BlockIds: blocks, NumTokens: 512, Consumer: de.id})
	if err != nil {
		b.Fatal(err)
	}
	notes := make(chan *nats.Msg, 16)
	sub, err := nc2.ChanSubscribe(api.PullDoneSubject(de.cli.Member, de.id), notes)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc2.Flush(); err != nil {
		b.Fatal(err)
	}
	iperfSrv := h1.Command("iperf3", "-s", "-B", h1.IP, "-p", "5201")
	if err := iperfSrv.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = iperfSrv.Process.Kill(); _ = iperfSrv.Wait() }()

	pull := func(id string) float64 {
		if _, err := de.cli.StartPull(ctx5(b), &messages.StartPullRequest{Params: hold.Params, EngineId: de.id, RegionId: de.rid, BlockIds: blocks, PullId: id}); err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		var done *messages.PullDone
		timeout := time.NewTimer(60 * time.Second)
		defer timeout.Stop()
		for done == nil {
			select {
			case m := <-notes:
				v := new(messages.PullDone)
				if proto.Unmarshal(m.Data, v) == nil && v.PullId == id {
					done = v
				}
			case <-timeout.C:
				b.Fatalf("pull %s: no pull.done within 60s", id)
			}
		}
		took := time.Since(t0)
		if !done.Ok {
			b.Fatalf("pull %s: %v", id, done)
		}
		if err := blocksDiffer(pe.region, de.region, blocks, blocks); err != nil {
			b.Fatalf("pull %s: %v", id, err)
		}
		return float64(done.Bytes) * 8 / took.Seconds() / 1e9
	}
	iperf := func() float64 {
		var out []byte
		var err error
		// The server may still be starting (first run) or finishing the
		// previous test: try again for a while.
		checkFor(b, 10*time.Second, 100*time.Millisecond, func() error {
			out, err = h2.Command("iperf3", "-c", h1.IP, "-p", "5201", "-t", "2", "-P", "2", "-J").Output()
			return err
		})
		var r struct {
			End struct {
				SumReceived struct {
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err := json.Unmarshal(out, &r); err != nil || r.End.SumReceived.BitsPerSecond == 0 {
			b.Fatalf("iperf3 output: %v\n%s", err, out)
		}
		return r.End.SumReceived.BitsPerSecond / 1e9
	}
	pull("warm") // connects and faults the destination's pages in
	var pulls, iperfs []float64
	b.ResetTimer()
	for i := 0; i < max(hostsBenchReps, b.N); i++ {
		pulls = append(pulls, pull(fmt.Sprintf("p%d", i)))
		iperfs = append(iperfs, iperf())
	}
	b.StopTimer()
	mp, mi := median(pulls), median(iperfs)
	fmt.Printf("hosts: %s (%s) -> %s (%s), veth + bridge + veth\n", h1.Name, h1.IP, h2.Name, h2.IP)
	fmt.Printf("  connex TCP pull, 128 MiB in 2048 pieces, Gbit/s: %s\n", gbitList(pulls))
	fmt.Printf("  iperf3, two streams, 2 s, Gbit/s:                %s\n", gbitList(iperfs))
	fmt.Printf("HOSTS tcp_pull_gbps=%.2f iperf3_gbps=%.2f ratio=%.2f\n", mp, mi, mp/mi)
}

// median is the middle value of v (the upper one of an even count; zero
// for none).
func median[T cmp.Ordered](v []T) T {
	if len(v) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func gbitList(v []float64) string {
	out := ""
	for i, x := range v {
		if i > 0 {
			out += " "
		}
		out += fmt.Sprintf("%.2f", x)
	}
	return out
}
