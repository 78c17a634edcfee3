package e2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// BenchmarkControlRTT measures, in one run and interleaved so both see the
// same machine noise, the control-plane round trip of one transfer through
// a connexd process — create a hold, fetch its pull descriptors, end the
// pull, release — against the same number of bare NATS request-replies with
// payloads of the same sizes on the same server, answered by a plain
// responder. It prints CONTROL hold_rtt_us=<a> nats_rtt_us=<b> ratio=<a/b>
// (medians of whole sequences).
func BenchmarkControlRTT(b *testing.B) {
	// BENCH_CONNEXD_ARGS adds flags (e.g. "--metrics-listen 127.0.0.1:0",
	// to measure what metrics cost).
	pn := startConnexd(b, "bench", append([]string{"--backend", "tcp", "--log-level", "warn"}, strings.Fields(os.Getenv("BENCH_CONNEXD_ARGS"))...)...)
	nc := connect(b, pn.natsURL)
	e := newEngine(b, nc, "bench", "engB", testLayout, false)
	peer := &api.Client{NC: nc, Member: "bench"}

	// Bare responder on its own connection, echoing a reply of the size
	// connexd's reply to the same step has.
	rc := connect(b, pn.natsURL)
	sizes := make([]int, 4)
	if _, err := rc.Subscribe("bench.echo.*", func(m *nats.Msg) {
		var i int
		fmt.Sscanf(m.Subject[len("bench.echo."):], "%d", &i)
		_ = m.Respond(make([]byte, sizes[i]))
	}); err != nil {
		b.Fatal(err)
	}
	_ = rc.Flush()

	layout := &messages.Layout{NumLayers: testLayout.Layers, KvPlanes: 2, NumBlocks: testLayout.Blocks, BlockBytes: testLayout.BlockBytes, BlockSize: testLayout.BlockSize, TpSize: 1}
	blocks := []uint32{0, 1, 2, 3, 4, 5, 6, 7}
	reqs := make([][]byte, 4)
	ctx := context.Background()
	holdSeq := func() time.Duration {
		t0 := time.Now()
		h, err := e.cli.CreateHold(ctx, &messages.CreateHoldRequest{EngineId: e.id, RegionId: e.rid, BlockIds: blocks, NumTokens: 128})
		if err != nil {
			b.Fatal(err)
		}
		id := h.Params.TransferId
		dreq := &messages.DescriptorsRequest{TransferId: id, Requester: "engD", PullId: "p", Layout: layout, TimeoutMs: 5000}
		d, err := peer.Descriptors(ctx, dreq)
		if err != nil {
			b.Fatal(err)
		}
		end := &messages.PullEnd{TransferId: id, Requester: "engD", PullId: "p", Ok: true}
		if _, err := peer.PullEnd(ctx, end); err != nil {
			b.Fatal(err)
		}
		rel := &messages.HoldRef{TransferId: id, Requester: "engD"}
		st, err := e.cli.Release(ctx, rel)
		if err != nil {
			b.Fatal(err)
		}
		el := time.Since(t0)
		if sizes[0] == 0 { // record payload sizes once for the bare run
			create := &messages.CreateHoldRequest{EngineId: e.id, RegionId: e.rid, BlockIds: blocks, NumTokens: 128}
			for i, pair := range [][2]proto.Message{{create, h}, {dreq, d}, {end, st}, {rel, st}} {
				in, _ := proto.Marshal(pair[0])
				out, _ := proto.Marshal(pair[1])
				reqs[i], sizes[i] = in, len(out)
			}
		}
		return el
	}
	bareSeq := func() time.Duration {
		t0 := time.Now()
		for i := 0; i < 4; i++ {
			if _, err := nc.Request(fmt.Sprintf("bench.echo.%d", i), reqs[i], 5*time.Second); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(t0)
	}
	for i := 0; i < 50; i++ { // warm up both paths
		holdSeq()
		bareSeq()
	}
	holds := make([]time.Duration, 0, b.N)
	bares := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		holds = append(holds, holdSeq())
		bares = append(bares, bareSeq())
	}
	b.StopTimer()
	h50, h99 := percentiles(holds)
	n50, n99 := percentiles(bares)
	b.ReportMetric(float64(h50.Microseconds()), "hold_p50_us")
	b.ReportMetric(float64(n50.Microseconds()), "nats_p50_us")
	if b.N >= 100 {
		fmt.Printf("control-plane sequence (4 requests): connexd p50=%s p99=%s | bare NATS p50=%s p99=%s | n=%d\n", h50, h99, n50, n99, b.N)
		fmt.Printf("CONTROL hold_rtt_us=%.1f nats_rtt_us=%.1f ratio=%.2f\n",
			float64(h50.Nanoseconds())/1e3, float64(n50.Nanoseconds())/1e3, float64(h50)/float64(n50))
	}
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2], s[len(s)*99/100]
}
