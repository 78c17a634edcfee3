package e2e

// BenchmarkPull's BREAKDOWN (where a small pull's fixed cost goes: its
// phases against the NATS floor of the same run) and its CPU profile of a
// reader connexd (BENCH_PULL_PROFILE).

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// bareNATSRoundTrip is the median of 301 request/replies through the
// server at url between two connections of this process (an echo).
func bareNATSRoundTrip(b *testing.B, url string) time.Duration {
	srv, cli := connect(b, url), connect(b, url)
	sub, err := srv.Subscribe("bench.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := srv.Flush(); err != nil {
		b.Fatal(err)
	}
	ds := make([]time.Duration, 301)
	for i := range ds {
		t0 := time.Now()
		if _, err := cli.Request("bench.echo", []byte("x"), 5*time.Second); err != nil {
			b.Fatal(err)
		}
		ds[i] = time.Since(t0)
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// pullPhases is where one pull's time went, from the client's StartPull to
// its PullDone notice (wall), by what the reader's PullDone reports.
type pullPhases struct {
	wall     time.Duration // StartPull sent → PullDone received (the bench's clock)
	startRPC time.Duration // StartPull's NATS request/reply: api decode, checks, puller spawn
	hops     time.Duration // wall - duration_us: StartPull in to the puller's start, and PullDone out to the engine
	desc     time.Duration // descriptors_us: puller start → descriptors in hand (the peer.descriptors round trip)
	read     time.Duration // read_us: the data-plane reads
	end      time.Duration // pull_end_us: the awaited peer.pullend round trip (0 when async)
	other    time.Duration // duration_us less the above: hand-offs between them, the destination check
	floor    time.Duration // the NATS floor chain run right after this pull (natsFloor)
	apiFloor time.Duration // the engine API's two-message chain run after that (natsFloor.apiChain)
}

func phasesOf(wall, startRPC time.Duration, d *messages.PullDone) pullPhases {
	us := func(v uint64) time.Duration { return time.Duration(v) * time.Microsecond }
	dur := us(d.DurationUs)
	return pullPhases{wall: wall, startRPC: startRPC, hops: wall - dur, desc: us(d.DescriptorsUs), read: us(d.ReadUs),
		end: us(d.PullEndUs), other: dur - us(d.DescriptorsUs) - us(d.ReadUs) - us(d.PullEndUs)}
}

// breakdownLine is the BREAKDOWN line of a case's "fixed" pulls: the median
// of each phase in ms (medians of parts need not add up to the median
// wall), and the share of the wall each median is.
func breakdownLine(name string, ps []pullPhases, natsRTT time.Duration) string {
	// at is the q-quantile of f over ps, in ms.
	at := func(q float64, f func(pullPhases) float64) float64 {
		if len(ps) == 0 {
			return 0
		}
		v := make([]float64, len(ps))
		for i, p := range ps {
			v[i] = f(p)
		}
		sort.Float64s(v)
		return v[int(q*float64(len(v)-1)+0.5)]
	}
	ms := func(f func(pullPhases) time.Duration) func(pullPhases) float64 {
		return func(p pullPhases) float64 { return float64(f(p)) / 1e6 }
	}
	wallOf := ms(func(p pullPhases) time.Duration { return p.wall })
	floorOf := ms(func(p pullPhases) time.Duration { return p.floor })
	wall := at(0.5, wallOf)
	parts := []struct {
		n string
		f func(pullPhases) time.Duration
	}{
		{"start_rpc", func(p pullPhases) time.Duration { return p.startRPC }},
		{"nats_in_out", func(p pullPhases) time.Duration { return p.hops }},
		{"descriptors", func(p pullPhases) time.Duration { return p.desc }},
		{"read", func(p pullPhases) time.Duration { return p.read }},
		{"pull_end", func(p pullPhases) time.Duration { return p.end }},
		{"other", func(p pullPhases) time.Duration { return p.other }},
	}
	line := fmt.Sprintf("BREAKDOWN %s fixed (2 x 64 KiB, medians of %d) wall_ms=%.3f", name, len(ps), wall)
	for _, p := range parts {
		m := at(0.5, ms(p.f))
		line += fmt.Sprintf(" %s_ms=%.3f", p.n, m)
		if wall > 0 {
			line += fmt.Sprintf("(%.0f%%)", 100*m/wall)
		}
	}
	rtt := float64(natsRTT) / 1e6
	line += fmt.Sprintf(" bare_nats_rtt_ms=%.3f nats_floor_ms=%.3f wall_p10_ms=%.3f nats_floor_p10_ms=%.3f",
		rtt, at(0.5, floorOf), at(0.1, wallOf), at(0.1, floorOf))
	if rtt > 0 {
		line += fmt.Sprintf(" wall/bare_nats_rtt=%.1f", wall/rtt)
	}
	// The ratio of each pull to the floor chain run right after it (the
	// same machine within tens of ms), median.
	line += fmt.Sprintf(" wall/nats_floor=%.2f", at(0.5, func(p pullPhases) float64 { return float64(p.wall) / float64(max(p.floor, 1)) }))
	// The engine API's own floor: pull.start in and pull.done out, nothing
	// between. No pull through the NATS subject API gets under it however
	// its descriptors travel; issue 30's 0.3 ms goal is against it here.
	apiOf := ms(func(p pullPhases) time.Duration { return p.apiFloor })
	apiFloor := at(0.5, apiOf)
	line += fmt.Sprintf(" api_floor_ms=%.3f api_floor_p10_ms=%.3f", apiFloor, at(0.1, apiOf))
	// Issue 46's goal (<= 1.5): the pull's fixed cost (its wall, median)
	// over the engine API's floor (median) measured in the same run.
	line += fmt.Sprintf(" fixed_vs_api_floor=%.2f", wall/max(apiFloor, 1e-9))
	return line
}

// profileCPU starts a CPU profile of the connexd serving Go's profiles at
// pprofURL (its ready line's pprof=) over the next seconds, and returns the
// function that waits for it and writes it to path. Choose the reps so that
// the pulls last longer than the profile: it then samples nothing else.
func profileCPU(b *testing.B, pprofURL, path string, seconds int) (wait func()) {
	b.Helper()
	if pprofURL == "" {
		b.Fatal("BENCH_PULL_PROFILE: the connexd printed no pprof= address")
	}
	done := make(chan error, 1)
	go func() {
		resp, err := http.Get(fmt.Sprintf("%sprofile?seconds=%d", pprofURL, seconds))
		if err == nil {
			defer resp.Body.Close()
			var f *os.File
			if f, err = os.Create(path); err == nil {
				_, err = io.Copy(f, resp.Body)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
		}
		done <- err
	}()
	return func() {
		if err := <-done; err != nil {
			b.Fatalf("CPU profile of %s: %v", path, err)
		}
		fmt.Printf("PROFILE %s (%d s of a connexd's CPU during its timed pulls)\n", path, seconds)
	}
}
