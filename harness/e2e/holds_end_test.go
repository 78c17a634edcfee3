package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/harness/localcluster"
	"github.com/connex/connex/messages"
)

// TestEveryEndingReleasesItsHold: however a request ends — finished,
// rejected after its prefill, failed (its only decode engine frozen, no
// first token), or its client gone mid-stream — the prefill hold it left
// is freed within a short bounded poll (6 s), not at claim_s (15 s) or
// retain_s (60 s).
func TestEveryEndingReleasesItsHold(t *testing.T) {
	c := startProduct(t, func(o *localcluster.Options) {
		o.Decode = 1
		o.RouterArgs = append(o.RouterArgs, "--router-first-token-ms", "1500")
		// Engines that cannot count a prompt before its prefill (no POST
		// /tokenize): a text prompt too long for max_tokens is then refused
		// after its prefill, the path whose hold release this checks.
		o.SimArgs = append(o.SimArgs, "--tokenize=false")
	})
	waitEngines(t, c)
	nc := connect(t, c.NATSURL())
	url := c.RouterURL() + "/v1/completions"
	freed := func(what string) {
		t.Helper()
		start := time.Now()
		// Well under claim_s (15 s) and retain_s: a release, not a lapse,
		// with room for a starved machine.
		checkFor(t, 6*time.Second, 20*time.Millisecond, func() error {
			if held, err := prefillHeld(t, nc, c); err != nil || held != 0 {
				return fmt.Errorf("%s: prefill blocks still held: %d (%v)", what, held, err)
			}
			return nil
		})
		t.Logf("%s: prefill blocks freed within %v of the answer", what, time.Since(start).Round(time.Millisecond))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Finished.
	if got, err := postStream(ctx, url, completion("a finished request", 4), nil); err != nil || got.status != 200 || got.dones != 1 {
		t.Fatalf("finished: %v %+v", err, got)
	}
	freed("finished")

	// Rejected after the prefill ran: with no /tokenize a text prompt's
	// length is known only then, and with max_tokens it exceeds the context.
	limit := routerMaxModelLen(t, c.RouterURL(), "connex-sim")
	prompt := "a rejected request"
	status, ans, err := postJSON(ctx, url, map[string]any{"model": "connex-sim", "prompt": prompt, "max_tokens": limit - len(prompt) + 1})
	if err != nil || status != 400 {
		t.Fatalf("rejected: %d %v %v", status, ans, err)
	}
	freed("rejected")

	// Failed: the only decode engine is frozen, so no first token comes and
	// there is nowhere to resume.
	if err := c.Stop("decode-0/engine"); err != nil {
		t.Fatal(err)
	}
	status, ans, err = postJSON(ctx, url, map[string]any{"model": "connex-sim", "prompt": "a failed request", "max_tokens": 4})
	if err != nil || status < 500 {
		t.Fatalf("failed: %d %v %v", status, ans, err)
	}
	freed("failed")
	if err := c.Cont("decode-0/engine"); err != nil {
		t.Fatal(err)
	}
	waitEngines(t, c)

	// Client gone mid-stream (the decode engine notices and finishes).
	cctx, ccancel := context.WithCancel(ctx)
	_, _ = postStream(cctx, url, completion("a client that leaves", 200), func(i int, s *streamed) {
		if i == 3 {
			ccancel()
		}
	})
	ccancel()
	freed("client gone")

	m := must2(scrapeAs(c.RouterURL()+"/metrics", c.AdminKey()))
	for _, reason := range []string{"rejected", "failed"} {
		if n := m[fmt.Sprintf(`connex_router_hold_releases_total{outcome="ok",reason=%q}`, reason)]; n != 1 {
			t.Errorf("router hold releases for %s: %v, want 1", reason, n)
		}
	}
}

// TestUnclaimedHoldIsFreed: a prefill leg whose decode leg never comes (a
// proxy in front of the engines whose decode leg failed, as behind
// vllm-router) leaves a hold nobody can release; the holder frees it at its
// own claim deadline (claim_s, 2 s here), as "unclaimed", not at retain_s
// (60 s).
func TestUnclaimedHoldIsFreed(t *testing.T) {
	c := startProduct(t, func(o *localcluster.Options) {
		o.Decode = 1
		o.PrefillConnexdArgs = append(o.PrefillConnexdArgs, "--claim-s", "2")
	})
	waitEngines(t, c)
	nc := connect(t, c.NATSURL())
	pre, err := c.EngineURL("prefill-0")
	if err != nil {
		t.Fatal(err)
	}
	ans := complete(t, pre, map[string]any{"prompt": "nobody decodes this", "max_tokens": 1,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false}})
	tid, _ := paramsWith(t, ans.KVTransferParams, nil)["transfer_id"].(string)
	if held, err := prefillHeld(t, nc, c); err != nil || held == 0 || tid == "" {
		t.Fatalf("the prefill leg must leave a hold: held %d transfer %q (%v)", held, tid, err)
	}
	checkFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if held, err := prefillHeld(t, nc, c); err != nil || held != 0 {
			return fmt.Errorf("prefill blocks held: %d (%v)", held, err)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := (&api.Client{NC: nc, Member: "prefill-0"}).Inspect(ctx, &messages.HoldRef{TransferId: tid})
	if err != nil || st.GetState() != "unclaimed" || !st.GetFreed() {
		t.Fatalf("the hold ended %v (%v), want unclaimed", st, err)
	}
}
