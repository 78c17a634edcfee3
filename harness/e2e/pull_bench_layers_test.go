package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// The engine API's layers (make bench-pull with BENCH_PULL_API_LAYERS=1):
// what answering a request costs at each layer between the bare relay of
// the API floor and connexd, each a request answered at once with caches
// scrubbed before it, run beside every fixed pull on the engine's own
// connection:
//
//   - relay: a bare NATS responder in a process of its own (the floor
//     relays' holder role);
//   - micro: the same behind nats.go's micro service framework, which
//     connexd's API uses (its stats, $SRV discovery);
//   - api_stub: api.Serve, connexd's API layer (content type, protobuf in
//     and out), in a process of its own whose pull.start answers at once,
//     called through api.Client as engines are;
//   - connexd: connexd's own pull.start sent again for the pull just done
//     (the same layers and the request's field checks, in the daemon's
//     process; connexd answers a repeat as the ended pull's before its
//     region and block checks, and starts nothing): a lower bound of a
//     real pull.start's answer.
//
// A pull's fixed cost cannot get under the connexd layer's answer plus the
// pull.done notice, whatever the pull itself does.

// apiLayersEnv turns the layer probes on.
const apiLayersEnv = "BENCH_PULL_API_LAYERS"

// Subjects and member of the layer relays.
const (
	layerMicroSubject = "bench.floor.micro"
	layerAPIMember    = "floorapi"
)

// apiLayersOn reports whether the layer probes run (apiLayersEnv=1).
func apiLayersOn() bool { return os.Getenv(apiLayersEnv) == "1" }

// serveMicroLayer answers layerMicroSubject through a micro service with
// an empty reply (the relay role "micro").
func serveMicroLayer(nc *nats.Conn) error {
	svc, err := micro.AddService(nc, micro.Config{Name: "floor", Version: "0.0.1"})
	if err != nil {
		return err
	}
	return svc.AddEndpoint("answer", micro.HandlerFunc(func(r micro.Request) { _ = r.Respond(nil) }), micro.WithEndpointSubject(layerMicroSubject))
}

// serveAPILayer serves connexd's API layer (the relay role "api") with a
// handler whose pull.start answers at once; no other endpoint is called.
// It is a "connex" micro service of member layerAPIMember on the bench's
// own NATS server: `connexd status` there would list it, and its
// member.status fails (the nil Handler's, answered as an internal error).
func serveAPILayer(nc *nats.Conn) error {
	_, err := api.Serve(nc, answeringHandler{}, api.ServeOptions{Member: layerAPIMember, Version: "0.0.1"})
	return err
}

// answeringHandler answers pull.start as connexd answers a started pull;
// its other methods are the nil Handler's (never called by the probes).
type answeringHandler struct{ api.Handler }

func (answeringHandler) StartPull(_ context.Context, r *messages.StartPullRequest) (*messages.StartPullReply, error) {
	return &messages.StartPullReply{PullId: r.PullId}, nil
}

// apiLayers is one round of the layer probes.
type apiLayers struct{ relay, micro, stub, connexd time.Duration }

// probeAPILayers times one request at each layer, on cli's connection
// (the decode engine's; cli's member is the reader connexd). again is the
// pull.start of the pull that just ended.
func probeAPILayers(b *testing.B, cli *api.Client, again *messages.StartPullRequest) apiLayers {
	b.Helper()
	timed := func(what string, call func() error) time.Duration {
		scrubCaches()
		t0 := time.Now()
		err := call()
		d := time.Since(t0)
		if err != nil {
			b.Fatalf("api layer %s: %v", what, err)
		}
		return d
	}
	pullStart := func(c *api.Client) func() error {
		return func() error {
			rep, err := c.StartPull(ctx5(b), again)
			if err == nil && rep.PullId != again.PullId {
				err = fmt.Errorf("answered pull %q, want %q", rep.PullId, again.PullId)
			}
			return err
		}
	}
	var l apiLayers
	l.relay = timed("relay", func() error { _, err := cli.NC.Request(floorDesc, []byte("x"), 5*time.Second); return err })
	l.micro = timed("micro", func() error { _, err := cli.NC.Request(layerMicroSubject, []byte("x"), 5*time.Second); return err })
	stub := *cli // the engine's client, on the stub's member
	stub.Member = layerAPIMember
	l.stub = timed("api_stub", pullStart(&stub))
	l.connexd = timed("connexd", pullStart(cli))
	return l
}

// apiLayersLine is the APILAYERS line of a case: each layer's median in ms,
// and each over the bare relay's.
func apiLayersLine(name string, ls []apiLayers) string {
	if len(ls) == 0 {
		return ""
	}
	med := func(f func(apiLayers) time.Duration) float64 {
		v := make([]time.Duration, len(ls))
		for i, l := range ls {
			v[i] = f(l)
		}
		slices.Sort(v)
		return float64(v[len(v)/2]) / 1e6
	}
	relay := med(func(l apiLayers) time.Duration { return l.relay })
	line := fmt.Sprintf("APILAYERS %s (a request answered at once, medians of %d) relay_ms=%.3f", name, len(ls), relay)
	for _, p := range []struct {
		n string
		f func(apiLayers) time.Duration
	}{
		{"micro", func(l apiLayers) time.Duration { return l.micro }},
		{"api_stub", func(l apiLayers) time.Duration { return l.stub }},
		{"connexd", func(l apiLayers) time.Duration { return l.connexd }},
	} {
		m := med(p.f)
		line += fmt.Sprintf(" %s_ms=%.3f(%.2f)", p.n, m, m/max(relay, 1e-9))
	}
	return line
}
