package e2e

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// TestHolderRestartTellsTheDecodeEngine: the prefill connexd holding a
// running request's blocks restarts (its holds are gone); the decode
// member's next keep-alive hears unknown_transfer and the request's engine
// gets one HoldLostNotice naming the request, the hold, the holder and the
// policy a resume will apply. The request still finishes, without a
// release of the hold that is gone.
func TestHolderRestartTellsTheDecodeEngine(t *testing.T) {
	c := newDecodeCluster(t, "d1")
	d1 := c.engines["d1"]
	prm := c.holdWith(t, &messages.CreateHoldRequest{BlockIds: []uint32{1, 2}, NumTokens: 32, RetainS: 3})
	lost := subscribe(t, c.nc, api.HoldLostSubject(d1.cli.Member, d1.id), func() *messages.HoldLostNotice { return new(messages.HoldLostNotice) })
	c.startRequest(t, "d1", "r-lost", prm, prompt(32))
	// request.start binds the hold to d1's engine on the holder after it
	// answered: a holder stopped before that ends a hold never bound (its
	// engine hears "released" at the bind), which is not this test.
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		for _, l := range strings.Split(c.procs["prefill"].logs(), "\n") {
			if strings.Contains(l, "hold bound to the request's engine") && strings.Contains(l, "request=r-lost") {
				return nil
			}
		}
		return errors.New("the prefill connexd has not bound the hold to r-lost's engine yet")
	})

	c.procs["prefill"].stop()
	c.procs["prefill"] = startConnexd(t, "prefill", "--backend", "tcp", "--nats-url", c.url, "--role", "prefill", "--cluster-preset", "local")
	// Keep-alives run every retain_s/3 = 1 s.
	n := lost.wait(t, 15*time.Second, func(m *messages.HoldLostNotice) bool { return m.RequestId == "r-lost" })
	if n.TransferId != prm.TransferId || n.Holder != "prefill" || n.Epoch != 1 ||
		api.Code(n.ErrorCode) != api.CodeUnknownTransfer || n.Reason != "unknown_transfer" || n.KvLoadFailurePolicy != "fail" {
		t.Fatalf("hold-lost notice: %v", n)
	}
	if _, err := d1.cli.FinishRequest(ctx5(t), &messages.FinishRequestMsg{RequestId: "r-lost", Epoch: 1}); err != nil {
		t.Fatalf("finish after the hold was lost: %v", err)
	}
}

// TestLapsedEngineEndsItsRequests: a decode engine that registered and
// then stops renewing (it died; its connexd lives) has its requests ended
// — router-driven or not — and the prefill hold they kept alive released
// well within retain_s.
func TestLapsedEngineEndsItsRequests(t *testing.T) {
	c := newDecodeCluster(t, "d1")
	d1 := c.engines["d1"]
	prm := c.holdWith(t, &messages.CreateHoldRequest{BlockIds: []uint32{1, 2}, NumTokens: 32, RetainS: 60})
	freed := subscribe(t, c.nc, api.FreedSubject(c.prefill.cli.Member, c.prefill.id), func() *messages.BlocksFreed { return new(messages.BlocksFreed) })
	if _, err := d1.cli.RegisterEngine(ctx5(t), &messages.RegisterEngineRequest{
		Engine: &messages.EngineInfo{EngineId: d1.id, Role: "decode", Model: "m", BaseUrl: "http://127.0.0.1:1", InstanceId: "i1"}, TtlMs: 500,
	}); err != nil {
		t.Fatal(err)
	}
	c.startRequest(t, "d1", "r-orphan", prm, prompt(32))
	lapse := time.Now()
	// No renewal: the registration lapses after 500 ms, the request ends
	// after the takeover grace (2 s), and the hold is released.
	f := freed.wait(t, 15*time.Second, func(m *messages.BlocksFreed) bool { return m.TransferId == prm.TransferId })
	t.Logf("lapse -> blocks freed: %s", time.Since(lapse).Round(time.Millisecond))
	if f.Reason != "released" {
		t.Fatalf("blocks freed as %q, want released (not expired after retain_s)", f.Reason)
	}
	if _, err := d1.cli.InspectRequest(ctx5(t), &messages.RequestRef{RequestId: "r-orphan"}); api.CodeOf(err) != api.CodeUnknownRequest {
		t.Fatalf("the lapsed engine's request after its end: %v, want unknown_request", err)
	}
}
