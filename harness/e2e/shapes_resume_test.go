package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
	"github.com/nats-io/nats.go"
)

// TestResumeAcrossShapes: engines of different TP sizes, block sizes and
// in-block orders in one cluster of real processes (router, connexd and
// connex-sim per engine). A request whose decode engine is SIGKILLed
// mid-stream resumes on a decode engine of another shape, pulling the same
// hold again (every rank its heads, the sampled positions of every head
// verified on load); the client's tokens equal the uninterrupted ones,
// with one prefill per request and none on the decode side. Prefilled at
// TP 1: a TP 2 decode engine dies and the request resumes at TP 1, then a
// TP 1 one dies and it resumes at TP 2; prefilled at TP 2, the same. The
// router picks the idle decode engine with the most free blocks, so the
// block counts order the victims: decode-0, then decode-1 (decode-0 stays
// dead), each resuming on the next (the second round's resume has one
// engine left: TP 1 → 2 in the first cluster, TP 2 → 1 in the second,
// whatever the router's suspicions on a loaded machine).
func TestResumeAcrossShapes(t *testing.T) {
	clusters := []struct {
		name   string
		shapes map[string][]string
	}{
		{"prefill-tp1", map[string][]string{
			"prefill-0": {"--tp", "1", "--block-size", "16"},
			"decode-0":  {"--tp", "2", "--block-size", "32", "--kv-order", "hnd", "--blocks", "1024"},
			"decode-1":  {"--tp", "1", "--block-size", "16", "--kv-order", "cpu", "--blocks", "768"},
			"decode-2":  {"--tp", "2", "--block-size", "8", "--blocks", "512"},
		}},
		{"prefill-tp2", map[string][]string{
			"prefill-0": {"--tp", "2", "--block-size", "32", "--kv-order", "hnd"},
			"decode-0":  {"--tp", "1", "--block-size", "16", "--blocks", "1024"},
			"decode-1":  {"--tp", "2", "--block-size", "8", "--kv-order", "cpu", "--blocks", "768"},
			"decode-2":  {"--tp", "1", "--block-size", "32", "--blocks", "512"},
		}},
	}
	const prompt, max, faultAt = "Prefilled on one shape, decoded on two others.", 60, 6
	var ref *streamed
	for _, cl := range clusters {
		t.Run(cl.name, func(t *testing.T) {
			c := startProduct(t, func(o *localcluster.Options) {
				o.Decode = 3
				o.SimArgsFor = func(name string, _ localcluster.Role) []string { return cl.shapes[name] }
			})
			nc := connect(t, c.NATSURL())
			url := c.RouterURL() + "/v1/completions"
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			first, err := postStream(ctx, url, completion(prompt, max), nil)
			if err != nil || first.status != 200 || len(first.ids) != max || len(first.errors) > 0 {
				t.Fatalf("reference: %v, status %d %s, %d tokens, errors %v", err, first.status, first.body, len(first.ids), first.errors)
			}
			if ref == nil {
				ref = first
			} else if fmt.Sprint(first.ids) != fmt.Sprint(ref.ids) {
				t.Fatalf("an uninterrupted answer differs between clusters of other shapes:\n%v\n%v", first.ids, ref.ids)
			}
			for _, v := range []struct{ victim, next string }{{"decode-0", "decode-1"}, {"decode-1", "decode-2"}} {
				t.Run(v.victim+"-dies", func(t *testing.T) {
					resumeAcrossShapes(t, ctx, c, nc, url, v.victim, v.next, prompt, max, faultAt, ref)
				})
			}
		})
	}
}

// resumeAcrossShapes waits for the decode engines to be idle, sends a
// stream, which must land on victim, SIGKILLs victim's engine at token
// faultAt and checks that the stream resumed on another decode engine
// (next, the one with the most free blocks, unless the router suspects its
// member) and equals ref.
func resumeAcrossShapes(t *testing.T, ctx context.Context, c *localcluster.Cluster, nc *nats.Conn, url, victim, next, prompt string, max, faultAt int, ref *streamed) {
	var (
		landed                string
		got                   *streamed
		prefills, resumes     float64
		decodePrefills, loads engineCounts
	)
	// The router picks the idle decode engine with the most free blocks,
	// unless it suspects its member (a late heartbeat on a loaded machine)
	// or its freed blocks are not reported yet: a stream that lands
	// elsewhere is left to finish and sent again, so that the pair of
	// shapes the case is about is the one resumed.
	for attempt := 1; ; attempt++ {
		waitEngines(t, c)
		checkFor(t, 10*time.Second, 20*time.Millisecond, func() error { return decodeIdle(c) })
		prefills = engineMetric(t, c, "prefill", "connex_sim_prefills_total")
		decodePrefills = countsOf(t, c, "decode", "connex_sim_prefills_total")
		resumes = sum(must2(scrapeAs(c.RouterURL()+"/metrics", c.AdminKey())), "connex_router_resumes_total")
		loads = countsOf(t, c, "decode", "connex_sim_kv_loads_total")
		var killErr error
		var err error
		got, err = postStream(ctx, url, completion(prompt, max), func(n int, s *streamed) {
			if n == faultAt {
				landed = s.header.Get("X-Connex-Decode-Engine")
				if landed == victim {
					killErr = c.Kill(landed + "/engine")
				}
			}
		})
		if err != nil || killErr != nil {
			t.Fatalf("stream: %v; kill: %v", err, killErr)
		}
		if landed == victim || attempt == 3 {
			break
		}
		t.Logf("attempt %d landed on %s, not %s (the router's pick on a loaded machine): again", attempt, landed, victim)
	}
	if landed != victim {
		t.Fatalf("the stream landed on %q three times, want %s (the idle decode engine with the most free blocks)", landed, victim)
	}
	if got.status != 200 || got.dones != 1 || len(got.errors) > 0 {
		t.Fatalf("after %s died: status %d %s, %d [DONE], errors %v", victim, got.status, got.body, got.dones, got.errors)
	}
	if fmt.Sprint(got.ids) != fmt.Sprint(ref.ids) {
		t.Fatalf("resumed answer differs from the uninterrupted one:\n got %v\nwant %v", got.ids, ref.ids)
	}
	m := must2(scrapeAs(c.RouterURL()+"/metrics", c.AdminKey()))
	if d := sum(m, "connex_router_resumes_total") - resumes; d != 1 {
		t.Fatalf("the router counted %v resumes, want 1", d)
	}
	// The victim's count is gone with it: the others loaded once more.
	if d := countsOf(t, c, "decode", "connex_sim_kv_loads_total").since(loads); d != 1 {
		t.Fatalf("the other decode engines loaded KV %v times, want once: the resume", d)
	}
	if engineMetric(t, c, next, "connex_sim_kv_loads_total") == 0 {
		// The router passed over next (its member suspected on a starved
		// machine): the request resumed on the third engine, another
		// shape too, but not the direction this round is for.
		t.Logf("the request resumed on another engine than %s", next)
	}
	if d := engineMetric(t, c, "prefill", "connex_sim_prefills_total") - prefills; d != 1 {
		t.Fatalf("%v prefills for one request, want exactly 1", d)
	}
	if d := countsOf(t, c, "decode", "connex_sim_prefills_total").since(decodePrefills); d != 0 {
		t.Fatalf("a decode engine prefilled %v times: the resume must pull the hold", d)
	}
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		held, err := prefillHeld(t, nc, c)
		if err != nil || held != 0 {
			return fmt.Errorf("prefill blocks still held after the request: %d (%v)", held, err)
		}
		return nil
	})
}

// decodeIdle is nil once the router has no request in flight (its own
// count of legs sent, which picks weigh, is then empty) and sees every live
// decode engine with nothing in flight and every block free, so that its
// next pick goes by block counts alone.
func decodeIdle(c *localcluster.Cluster) error {
	m, err := scrapeAs(c.RouterURL()+"/metrics", c.AdminKey())
	if err != nil {
		return err
	}
	if n := sum(m, "connex_router_requests_in_flight"); n != 0 {
		return fmt.Errorf("the router has %v requests in flight", n)
	}
	req, err := http.NewRequest(http.MethodGet, c.RouterURL()+"/connex/v1/engines", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.AdminKey())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var list []struct {
		EngineID    string `json:"engine_id"`
		Role        string `json:"role"`
		InFlight    uint32 `json:"in_flight"`
		BlocksFree  uint32 `json:"blocks_free"`
		BlocksTotal uint32 `json:"blocks_total"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return err
	}
	for _, e := range list {
		if e.Role == "decode" && (e.InFlight != 0 || e.BlocksFree != e.BlocksTotal) {
			return fmt.Errorf("decode engine %s: %d in flight, %d of %d blocks free", e.EngineID, e.InFlight, e.BlocksFree, e.BlocksTotal)
		}
	}
	return nil
}
