package router

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/connex/connex/clock"
)

// TestRetiredLegJudgesLife: a given-up leg's resume is false only for a
// leg given up on a guess (stalled, engine_left) that showed life after: a
// chunk, or a 2xx answer to the probe outstanding at the decision. An
// answer to an earlier probe (sent before the last token, answered before
// the engine hung) is not life, nor is anything from a broken leg.
func TestRetiredLegJudgesLife(t *testing.T) {
	s := &Server{metrics: newMetrics(), log: slog.New(slog.NewTextHandler(io.Discard, nil)), clock: clock.NewFake(time.Unix(1000, 0)), done: make(chan struct{})}
	for _, c := range []struct {
		name        string
		reason      string
		outstanding int
		send        func(events chan<- legEvent, probes chan<- probeAnswer)
		false       float64
	}{
		{"stalled, a chunk", "stalled", 0, func(e chan<- legEvent, _ chan<- probeAnswer) { e <- legEvent{chunk: &engineChunk{}} }, 1},
		{"stalled, its last probe answered", "stalled", 2, func(_ chan<- legEvent, p chan<- probeAnswer) { p <- probeAnswer{probe: 2, alive: true} }, 1},
		{"stalled, an earlier probe answered", "stalled", 2, func(_ chan<- legEvent, p chan<- probeAnswer) { p <- probeAnswer{probe: 1, alive: true} }, 0},
		{"stalled, its last probe failed", "stalled", 2, func(_ chan<- legEvent, p chan<- probeAnswer) { p <- probeAnswer{probe: 2} }, 0},
		{"engine left, a chunk", "engine_left", 0, func(e chan<- legEvent, _ chan<- probeAnswer) { e <- legEvent{chunk: &engineChunk{}} }, 1},
		{"broken, a probe answered", "broken", 2, func(_ chan<- legEvent, p chan<- probeAnswer) { p <- probeAnswer{probe: 2, alive: true} }, 0},
		{"stalled, nothing", "stalled", 2, func(chan<- legEvent, chan<- probeAnswer) {}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s.metrics = newMetrics()
			events, probes := make(chan legEvent), make(chan probeAnswer) // unbuffered: a send returns once the watch took it
			abandoned := false
			r := s.retire("r1", c.reason, "d1", s.clock.Now(), events, probes, c.outstanding, func() { abandoned = true })
			c.send(events, probes)
			events <- legEvent{} // taken once the watch is done with what came before
			r.close()
			if n := counted(t, s, "connex_router_false_resumes_total"); n != c.false || !abandoned {
				t.Fatalf("%v false resumes (abandoned %v), want %v", n, abandoned, c.false)
			}
		})
	}
}
