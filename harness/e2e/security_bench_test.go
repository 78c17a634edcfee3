package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/auth"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// engineConn connects as engine of member on url the way the engine's
// shim would: its own credentials (when url authenticates), its inbox
// prefix, and the server's CA (when url serves TLS).
func engineConn(t testing.TB, url, member, engine string) *nats.Conn {
	t.Helper()
	id := auth.Identity{Role: auth.RoleEngine, Member: member, Engine: engine}
	opts := []nats.Option{nats.CustomInboxPrefix(id.InboxPrefix())}
	if f := credsFlags(t, url, "", "--role", "engine", "--member", member, "--engine", engine); len(f) == 2 {
		opts = append(opts, nats.UserCredentials(f[1]))
	}
	return dial(t, url, opts...)
}

// BenchmarkControlSecurity measures what authentication and TLS cost the
// control plane, in one run, interleaved: the same transfer sequence as
// BenchmarkControlRTT (hold.create and hold.release by the engine in its
// own scope with its own credentials, peer.descriptors and peer.pullend
// in the member scope) against three connexd processes whose embedded
// NATS runs without authentication (the reference), with it (the
// default), and with it over TLS. It prints SECURITY plain_us=<a>
// auth_us=<b> tls_us=<c> auth_ratio=<b/a> tls_ratio=<c/a> (medians).
func BenchmarkControlSecurity(b *testing.B) {
	cert, key := selfSignedCert(b)
	setups := []struct {
		name string
		args []string
	}{
		{"plain", []string{"--nats-auth", "off"}},
		{"auth", nil},
		{"tls", []string{"--nats-tls-cert", cert, "--nats-tls-key", key, "--nats-tls-ca", cert}},
	}
	type target struct {
		e    *engine
		peer *api.Client
		seqs []time.Duration
	}
	layout := &messages.Layout{NumLayers: testLayout.Layers, KvPlanes: 2, NumBlocks: testLayout.Blocks, BlockBytes: testLayout.BlockBytes, BlockSize: testLayout.BlockSize, TpSize: 1}
	var targets []*target
	for _, s := range setups {
		member := "sec-" + s.name
		pn := startConnexd(b, member, append([]string{"--backend", "tcp", "--log-level", "warn"}, s.args...)...)
		cli := &api.Client{NC: engineConn(b, pn.natsURL, member, "engS"), Member: member, Engine: "engS"}
		e, _ := newCreatedEngineAs(b, cli, "engS", testLayout, false)
		targets = append(targets, &target{e: e, peer: &api.Client{NC: connect(b, pn.natsURL), Member: member}, seqs: make([]time.Duration, 0, b.N)})
	}
	ctx := context.Background()
	blocks := []uint32{0, 1, 2, 3, 4, 5, 6, 7}
	seq := func(tg *target) time.Duration {
		t0 := time.Now()
		h, err := tg.e.cli.CreateHold(ctx, &messages.CreateHoldRequest{RegionId: tg.e.rid, BlockIds: blocks, NumTokens: 128})
		if err != nil {
			b.Fatal(err)
		}
		id := h.Params.TransferId
		if _, err := tg.peer.Descriptors(ctx, &messages.DescriptorsRequest{TransferId: id, Requester: "engD", PullId: "p", Layout: layout, TimeoutMs: 5000}); err != nil {
			b.Fatal(err)
		}
		if _, err := tg.peer.PullEnd(ctx, &messages.PullEnd{TransferId: id, Requester: "engD", PullId: "p", Ok: true}); err != nil {
			b.Fatal(err)
		}
		if _, err := tg.e.cli.Release(ctx, &messages.HoldRef{TransferId: id}); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	for range 50 { // warm up every path
		for _, tg := range targets {
			seq(tg)
		}
	}
	b.ResetTimer()
	for range b.N {
		for _, tg := range targets {
			tg.seqs = append(tg.seqs, seq(tg))
		}
	}
	b.StopTimer()
	var p50 [3]time.Duration
	for i, tg := range targets {
		p, p99 := percentiles(tg.seqs)
		p50[i] = p
		if b.N >= 100 {
			fmt.Printf("control-plane sequence, %-5s: p50=%s p99=%s n=%d\n", setups[i].name, p, p99, b.N)
		}
	}
	b.ReportMetric(float64(p50[1])/float64(p50[0]), "auth_ratio")
	if b.N >= 100 {
		us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		fmt.Printf("SECURITY plain_us=%.1f auth_us=%.1f tls_us=%.1f auth_ratio=%.2f tls_ratio=%.2f\n",
			us(p50[0]), us(p50[1]), us(p50[2]), float64(p50[1])/float64(p50[0]), float64(p50[2])/float64(p50[0]))
	}
}
