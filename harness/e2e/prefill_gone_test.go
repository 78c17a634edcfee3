package e2e

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// TestClientGoneMidPrefillFreesItsBlocks: a client that hangs up while its
// prefill leg runs leaves the prefill engine's free block count, and its
// connexd's held blocks, back where they were within a few seconds (issue
// 32: a prefill connex-sim kept blocks for minutes after such a client).
// Two moments: while the engine computes the prompt's KV, and while its
// hold.create is in flight (its connexd frozen for that long). The second
// left connexd holding blocks the engine had already freed, until claim_s
// (15 s), when the engine gave up on hold.create with its client.
func TestClientGoneMidPrefillFreesItsBlocks(t *testing.T) {
	var logs safeBuffer
	c := startProduct(t, func(o *localcluster.Options) {
		o.Decode = 1
		o.PrefillPerToken = time.Millisecond
		o.Log = io.MultiWriter(o.Log, &logs)
	})
	waitEngines(t, c)
	nc := connect(t, c.NATSURL())
	url := c.RouterURL() + "/v1/completions"
	free0 := engineMetric(t, c, "prefill", "connex_sim_blocks_free")
	if free0 == 0 {
		t.Fatal("the prefill engine reports no free blocks")
	}
	// settled: the engine has every block back and no hold, and its
	// connexd holds none.
	settled := func(what string) {
		t.Helper()
		start := time.Now()
		checkFor(t, 6*time.Second, 20*time.Millisecond, func() error {
			free, holds := engineMetric(t, c, "prefill", "connex_sim_blocks_free"), engineMetric(t, c, "prefill", "connex_sim_holds")
			held, err := prefillHeld(t, nc, c)
			if err != nil || free != free0 || holds != 0 || held != 0 {
				return fmt.Errorf("%s: engine %v/%v blocks free, %v holds; its connexd holds %d blocks (%v)", what, free, free0, holds, held, err)
			}
			return nil
		})
		t.Logf("%s: prefill blocks back within %v", what, time.Since(start).Round(time.Millisecond))
	}
	// send posts a completion whose client hangs up once leaving says so.
	send := func(prompt string, leaving func() bool) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := postStream(ctx, url, completion(prompt, 50), nil)
			done <- err
		}()
		checkFor(t, 10*time.Second, 2*time.Millisecond, func() error {
			if !leaving() {
				return fmt.Errorf("the prefill has not reached the moment to hang up at")
			}
			return nil
		})
		cancel()
		if err := <-done; err == nil {
			t.Fatal("the request ended before its client hung up")
		}
	}

	// While the engine computes: 3000 prompt tokens at 1 ms each; the
	// client leaves once the engine took the prompt's blocks.
	send(strings.Repeat("k", 3000), func() bool {
		return engineMetric(t, c, "prefill", "connex_sim_blocks_free") < free0
	})
	settled("gone during the prefill's compute")

	// While hold.create is in flight: the prefill's connexd is frozen, the
	// engine computes 16 tokens and asks for its hold; the client leaves
	// and the router lets the leg go before connexd answers.
	prefills := engineMetric(t, c, "prefill", "connex_sim_prefills_total")
	if err := c.Stop("prefill-0/connexd"); err != nil {
		t.Fatal(err)
	}
	frozen := true
	defer func() {
		if frozen {
			_ = c.Cont("prefill-0/connexd")
		}
	}()
	left := strings.Count(logs.String(), "client left during the prefill")
	send(strings.Repeat("h", 16), func() bool {
		return engineMetric(t, c, "prefill", "connex_sim_prefills_total") > prefills
	})
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if strings.Count(logs.String(), "client left during the prefill") == left {
			return fmt.Errorf("the router has not let the prefill leg go")
		}
		return nil
	})
	if err := c.Cont("prefill-0/connexd"); err != nil {
		t.Fatal(err)
	}
	frozen = false
	settled("gone during hold.create")
	if !strings.Contains(logs.String(), "released the hold of an undelivered prefill answer") {
		t.Error("the engine did not release the hold connexd made after its client left")
	}
}
