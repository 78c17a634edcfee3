package e2e

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/messages"
)

// BenchmarkFailover measures, over repeated trials with real connexd
// processes and the local failure-detection preset (TTL 1 s), the time from
// SIGKILL (and, separately, SIGSTOP) of the decode member hosting a request
// to the resume notice sent by the request actor respawned on another
// member. It prints p50/p99 and
// FAILOVER kill_p99_ms=<a> hang_p99_ms=<b>. FAILOVER_TRIALS sets the
// number of trials of each kind (default 10).
func BenchmarkFailover(b *testing.B) {
	trials := 10
	if s := os.Getenv("FAILOVER_TRIALS"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			trials = n
		}
	}
	c := newDecodeCluster(b, "s1", "s2")
	res := subscribe(b, c.nc, "connex.v1.engine.*.*.request.resume", func() *messages.ResumeNotice { return new(messages.ResumeNotice) })
	prm := c.hold(b, []uint32{0, 1}, 32)
	measure := func(kind string, sig syscall.Signal, i int) time.Duration {
		name := fmt.Sprintf("%s%d", kind, i)
		c.addDecoder(name)
		c.waitMembers(4) // prefill, s1, s2 and the new member
		id := "req-" + name
		e := c.engines[name]
		c.startRequest(b, name, id, prm, prompt(32))
		_ = e
		t0 := time.Now()
		c.procs[name].signal(sig)
		n := res.wait(b, 10*time.Second, func(m *messages.ResumeNotice) bool { return m.State.RequestId == id })
		el := time.Since(t0)
		if n.State.Owner == name {
			b.Fatalf("%s resumed on its dead owner", id)
		}
		c.procs[name].signal(syscall.SIGKILL)
		// Finish it so the survivors' load stays flat across trials.
		owner := c.engines[n.State.Owner]
		if _, err := owner.cli.FinishRequest(ctx5(b), &messages.FinishRequestMsg{RequestId: id, Epoch: n.State.Epoch}); err != nil {
			b.Logf("finish %s: %v", id, err)
		}
		return el
	}
	var kills, hangs []time.Duration
	b.ResetTimer()
	for i := 0; i < trials; i++ {
		kills = append(kills, measure("k", syscall.SIGKILL, i))
		hangs = append(hangs, measure("h", syscall.SIGSTOP, i))
	}
	b.StopTimer()
	k50, k99 := percentiles(kills)
	h50, h99 := percentiles(hangs)
	fmt.Printf("kill -> respawned: p50=%s p99=%s (n=%d)\n", k50.Round(time.Millisecond), k99.Round(time.Millisecond), len(kills))
	fmt.Printf("hang -> respawned: p50=%s p99=%s (n=%d, TTL=1s local preset)\n", h50.Round(time.Millisecond), h99.Round(time.Millisecond), len(hangs))
	fmt.Printf("FAILOVER kill_p99_ms=%d hang_p99_ms=%d\n", k99.Milliseconds(), h99.Milliseconds())
}
