package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/harness/localcluster"
	"github.com/connex/connex/harness/poll"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

var (
	productOnce sync.Once
	productBins localcluster.Binaries
	productErr  error
)

// productBinaries builds connexd (with the router) and connex-sim once per
// test binary.
func productBinaries(t testing.TB) localcluster.Binaries {
	t.Helper()
	productOnce.Do(func() {
		dir, err := os.MkdirTemp("", "connex-product-")
		if err != nil {
			productErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		productBins, productErr = localcluster.Build(ctx, dir, buildTags())
	})
	if productErr != nil {
		t.Fatal(productErr)
	}
	return productBins
}

// startProduct starts a local P/D cluster through the real binaries.
func startProduct(t testing.TB, mod func(*localcluster.Options)) *localcluster.Cluster {
	t.Helper()
	bins := productBinaries(t)
	o := localcluster.Defaults()
	o.Connexd, o.Sim = bins.Connexd, bins.Sim
	o.DecodePerToken = 15 * time.Millisecond
	o.PrefillPerToken = 20 * time.Microsecond
	o.LogLevel = "info"
	var logs safeBuffer
	o.Log = &logs
	if mod != nil {
		mod(&o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := localcluster.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
		if t.Failed() {
			l := logs.String()
			if len(l) > 20000 {
				l = "…" + l[len(l)-20000:]
			}
			t.Logf("cluster log:\n%s", l)
		}
	})
	if f := c.AdminCreds(); f != "" {
		url, dir := c.NATSURL(), filepath.Dir(f)
		authorities.Store(url, dir)
		t.Cleanup(func() { authorities.CompareAndDelete(url, dir) })
	}
	return c
}

// safeBuffer is the cluster's log sink (poll.Buffer).
type safeBuffer = poll.Buffer

var _ io.Writer = (*safeBuffer)(nil)

// engineMetric sums metric name over the engines whose names start with prefix.
func engineMetric(t testing.TB, c *localcluster.Cluster, prefix, name string) float64 {
	t.Helper()
	var total float64
	for _, e := range c.Engines() {
		if !strings.HasPrefix(e.Name, prefix) || e.URL == "" {
			continue
		}
		m, err := scrape(e.URL + "/metrics")
		if err != nil {
			continue // a killed engine has no metrics; its counts are gone with it
		}
		total += sum(m, name)
	}
	return total
}

// engineCounts is a counter's value per engine process (name and pid),
// taken by countsOf: since (below) compares two of them so that a killed
// engine's counts, gone with it, do not read as counts going down.
type engineCounts map[string]float64

// countsOf reads counter name on every engine whose name starts with
// prefix and that serves metrics now, keyed by engine process.
func countsOf(t testing.TB, c *localcluster.Cluster, prefix, name string) engineCounts {
	t.Helper()
	counts := engineCounts{}
	for _, e := range c.Engines() {
		if !strings.HasPrefix(e.Name, prefix) || e.URL == "" {
			continue
		}
		m, err := scrape(e.URL + "/metrics")
		if err != nil {
			if c.Running(e.Name + "/" + string(localcluster.PartEngine)) {
				// Skipped, its whole count would read as growth later.
				t.Fatalf("metrics of %s, which runs: %v", e.Name, err)
			}
			continue // a killed engine has no metrics
		}
		counts[fmt.Sprintf("%s/%d", e.Name, e.EnginePID)] = sum(m, name)
	}
	return counts
}

// since is how much the counter grew from before to now over the engine
// processes that run now: one that ran before counts its growth, one
// started since (a restart) all of its count, one gone since nothing.
func (now engineCounts) since(before engineCounts) float64 {
	var d float64
	for k, v := range now {
		d += v - before[k]
	}
	return d
}

// prefillHeld is how many blocks the prefill engines' connexds hold.
func prefillHeld(t testing.TB, nc *nats.Conn, c *localcluster.Cluster) (uint32, error) {
	var held uint32
	for _, e := range c.Engines() {
		if e.Role != localcluster.RolePrefill {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		info, err := (&api.Client{NC: nc, Member: e.Name}).InspectRegion(ctx, &messages.RegionRef{EngineId: e.Name, RegionId: "r0"})
		cancel()
		if err != nil {
			return 0, err
		}
		held += info.BlocksHeld + info.BlocksReading
	}
	return held, nil
}

func completion(prompt string, max int) map[string]any {
	return map[string]any{"model": "connex-sim", "prompt": prompt, "max_tokens": max, "stream": true, "return_token_ids": true,
		"stream_options": map[string]any{"include_usage": true}}
}

// TestStreamSurvivesDecodeFaults: a decode engine, or its connexd, killed
// or frozen mid-stream; the client's stream equals the uninterrupted one,
// with one [DONE], exactly one prefill, and the prefill blocks freed after.
func TestStreamSurvivesDecodeFaults(t *testing.T) {
	c := startProduct(t, func(o *localcluster.Options) { o.Metrics = true })
	nc := connect(t, c.NATSURL())
	url := c.RouterURL() + "/v1/completions"
	// 120 tokens at 15 ms: the stream outlasts the local preset's 1 s TTL,
	// which is what notices a frozen connexd whose engine still streams.
	const prompt, max, faultAt = "The quick brown fox jumps over the lazy dog.", 120, 8
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ref, err := postStream(ctx, url, completion(prompt, max), nil)
	if err != nil {
		t.Fatal(err)
	}
	if ref.status != 200 || ref.dones != 1 || len(ref.ids) != max || len(ref.errors) > 0 {
		t.Fatalf("reference: status %d %s, %d tokens, %d [DONE], errors %v", ref.status, ref.body, len(ref.ids), ref.dones, ref.errors)
	}
	cases := []struct {
		name   string
		part   string // engine or connexd
		signal string // kill or stop
	}{
		{"engine-SIGKILL", "engine", "kill"},
		{"engine-SIGSTOP", "engine", "stop"},
		{"connexd-SIGKILL", "connexd", "kill"},
		{"connexd-SIGSTOP", "connexd", "stop"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prefills := engineMetric(t, c, "prefill", "connex_sim_prefills_total")
			resumes := sum(must2(scrapeAs(c.RouterURL()+"/metrics", c.AdminKey())), "connex_router_resumes_total")
			falseResumes := sum(must2(scrapeAs(c.RouterURL()+"/metrics", c.AdminKey())), "connex_router_false_resumes_total")
			decodePrefills := engineMetric(t, c, "decode", "connex_sim_prefills_total")
			movedAhead := membersMetric(t, c, "connex_request_grants_moved_total")
			var victim string
			var faultErr error
			got, err := postStream(ctx, url, completion(prompt, max), func(i int, s *streamed) {
				if i != faultAt {
					return
				}
				victim = s.header.Get("X-Connex-Decode-Engine")
				target := victim + "/" + tc.part
				if tc.signal == "kill" {
					faultErr = c.Kill(target)
				} else {
					faultErr = c.Stop(target)
					t.Cleanup(func() { _ = c.Cont(target) })
				}
			})
			if err != nil || faultErr != nil {
				t.Fatalf("stream: %v; fault: %v", err, faultErr)
			}
			if victim == "" {
				t.Fatal("the router named no decode engine (X-Connex-Decode-Engine)")
			}
			if got.status != 200 || got.text() != ref.text() || got.dones != 1 || len(got.errors) > 0 {
				t.Fatalf("after %s of %s: status %d, %d [DONE], errors %v\n got %q\nwant %q", tc.name, victim, got.status, got.dones, got.errors, got.text(), ref.text())
			}
			if fmt.Sprint(got.ids) != fmt.Sprint(ref.ids) {
				t.Fatalf("token ids differ:\n got %v\nwant %v", got.ids, ref.ids)
			}
			if got.usage["completion_tokens"] != max || got.usage["prompt_tokens"] != ref.usage["prompt_tokens"] {
				t.Fatalf("usage %v, want %v", got.usage, ref.usage)
			}
			if d := sum(must2(scrapeAs(c.RouterURL()+"/metrics", c.AdminKey())), "connex_router_resumes_total") - resumes; d != 1 {
				t.Fatalf("the router counted %v resumes, want 1: the fault must land mid-stream", d)
			}
			if d := engineMetric(t, c, "prefill", "connex_sim_prefills_total") - prefills; d != 1 {
				t.Fatalf("%v prefills on the prefill engine for one request, want exactly 1", d)
			}
			// A killed or frozen engine shows no life before the resumed
			// stream's first token (a frozen one is continued only below):
			// the resume is not counted false.
			if d := sum(must2(scrapeAs(c.RouterURL()+"/metrics", c.AdminKey())), "connex_router_false_resumes_total") - falseResumes; d != 0 && tc.part == "engine" {
				t.Fatalf("the router counted %v false resumes after a %s of the engine, want 0", d, tc.signal)
			}
			// The resumed engine's member moved the request when the
			// router's grant came, ahead of the engine's takeover (every
			// member still runs after an engine's fault).
			if tc.part == "engine" {
				if d := membersMetric(t, c, "connex_request_grants_moved_total") - movedAhead; d != 1 {
					t.Fatalf("members moved %v requests ahead of their takeover after a %s of the engine, want 1", d, tc.signal)
				}
			}
			if tc.signal == "stop" {
				if err := c.Cont(victim + "/" + tc.part); err != nil {
					t.Fatal(err)
				}
			}
			checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
				held, err := prefillHeld(t, nc, c)
				if err != nil || held != 0 {
					return fmt.Errorf("prefill blocks still held after the request: %d (%v)", held, err)
				}
				return nil
			})
			if d := engineMetric(t, c, "decode", "connex_sim_prefills_total") - decodePrefills; d > 0 && tc.signal == "stop" {
				t.Fatalf("a decode engine prefilled %v times: the resume must pull the hold", d)
			}
			// Put the victim back for the next case: a killed connexd takes its
			// engine's region with it, so both restart.
			if tc.signal == "kill" {
				rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
				defer rcancel()
				if err := c.Restart(rctx, victim); err != nil {
					t.Fatal(err)
				}
			}
			waitEngines(t, c)
		})
	}
}

// membersMetric sums series name over the cluster's connexds (members and
// the router's) that serve metrics now.
func membersMetric(t testing.TB, c *localcluster.Cluster, name string) float64 {
	t.Helper()
	var total float64
	for _, m := range c.MetricsTargets() {
		if !strings.HasSuffix(m.Process, "/"+string(localcluster.PartConnexd)) {
			continue
		}
		got, err := scrape(m.URL)
		if err != nil {
			t.Fatalf("metrics of %s: %v", m.Process, err)
		}
		total += got[name]
	}
	return total
}

func must2[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// waitEngines waits until the router lists exactly the engines that run
// and are not stopped (localcluster.WaitEngines).
func waitEngines(t testing.TB, c *localcluster.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitEngines(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestHoldGonePolicies: the hold is gone (its prefill member died) when the
// decode engine dies too; kv_load_failure_policy decides: fail ends the
// request with a clear error (an error event then [DONE] once streaming,
// an OpenAI error body before), recompute prefills on the decode engine and
// answers right, counted as a prefill.
func TestHoldGonePolicies(t *testing.T) {
	const prompt, max, faultAt = "Connex keeps the KV after the first read.", 16, 4
	for _, policy := range []string{"fail", "recompute"} {
		t.Run(policy, func(t *testing.T) {
			c := startProduct(t, func(o *localcluster.Options) {
				o.DecodeConnexdArgs = []string{"--kv-load-failure-policy", policy}
			})
			url := c.RouterURL() + "/v1/completions"
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ref, err := postStream(ctx, url, completion(prompt, max), nil)
			if err != nil || ref.status != 200 {
				t.Fatalf("reference: %v %d %s", err, ref.status, ref.body)
			}
			for _, stream := range []bool{true, false} {
				before := countsOf(t, c, "decode", "connex_sim_prefills_total")
				var victim string
				var faultErr error
				body := completion(prompt, max)
				// Both legs die: the prefill member (its holds with it), then
				// the decode engine streaming the request.
				onChunk := func(i int, s *streamed) {
					if i == faultAt {
						victim = s.header.Get("X-Connex-Decode-Engine")
						faultErr = errorsJoin(c.Kill("prefill-0/connexd"), c.Kill(victim+"/engine"))
					}
				}
				var got *streamed
				if stream {
					got, err = postStream(ctx, url, body, onChunk)
				} else {
					got, err = nonStreamedWithFault(ctx, c, url, body)
				}
				if err != nil || faultErr != nil {
					t.Fatalf("stream=%v: %v; fault: %v", stream, err, faultErr)
				}
				switch {
				case policy == "recompute":
					if got.status != 200 || got.text() != ref.text() || len(got.errors) > 0 {
						t.Fatalf("stream=%v recompute: status %d %s errors %v\n got %q\nwant %q", stream, got.status, got.body, got.errors, got.text(), ref.text())
					}
					// The victim's counts are gone with it (it may have
					// recomputed in the round before): the survivors'.
					if d := countsOf(t, c, "decode", "connex_sim_prefills_total").since(before); d < 1 {
						t.Fatalf("stream=%v: the decode engine's recompute was not counted as a prefill (%v)", stream, d)
					}
				case stream:
					if got.status != 200 || got.dones != 1 || len(got.errors) != 1 || !strings.Contains(got.errors[0], "kv_load_failed") {
						t.Fatalf("fail, streaming: status %d, %d [DONE], errors %v: want one kv_load_failed error event then [DONE]", got.status, got.dones, got.errors)
					}
				default:
					if got.status != 503 || !strings.Contains(got.body, `"code":"kv_load_failed"`) {
						t.Fatalf("fail, not streaming: status %d body %s: want 503 kv_load_failed", got.status, got.body)
					}
				}
				rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
				err = errorsJoin(c.Restart(rctx, "prefill-0/connexd"), c.Restart(rctx, "prefill-0/engine"))
				if victim != "" {
					err = errorsJoin(err, c.Restart(rctx, victim+"/engine"))
				}
				if err == nil {
					err = c.WaitReady(rctx)
				}
				rcancel()
				if err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func errorsJoin(errs ...error) error {
	var msgs []string
	for _, e := range errs {
		if e != nil {
			msgs = append(msgs, e.Error())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}

// nonStreamedWithFault posts a non-streamed request and, while the router
// assembles it, kills the prefill connexd and the decode engine running it,
// as soon as a decode engine has allocated blocks for the request.
func nonStreamedWithFault(ctx context.Context, c *localcluster.Cluster, url string, body map[string]any) (*streamed, error) {
	body = maps.Clone(body)
	body["stream"] = false
	delete(body, "stream_options")
	type answer struct {
		status int
		out    map[string]any
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		status, out, err := postJSON(ctx, url, body)
		done <- answer{status, out, err}
	}()
	killed := false
	for {
		select {
		case a := <-done:
			s := &streamed{status: a.status}
			if a.err != nil {
				return nil, a.err
			}
			if a.status != 200 {
				b, _ := json.Marshal(a.out)
				s.body = string(b)
				return s, nil
			}
			ch := a.out["choices"].([]any)[0].(map[string]any)
			s.texts = []string{ch["text"].(string)}
			return s, nil
		case <-time.After(5 * time.Millisecond):
		}
		if killed {
			continue
		}
		for _, e := range c.Engines() {
			if e.Role != localcluster.RoleDecode || e.URL == "" {
				continue
			}
			m, err := scrape(e.URL + "/metrics")
			// A decode engine with blocks allocated runs the request.
			if err == nil && sum(m, "connex_sim_blocks_free") < sum(m, "connex_sim_blocks_total") {
				if err := errorsJoin(c.Kill("prefill-0/connexd"), c.Kill(e.Name+"/engine")); err != nil {
					return nil, err
				}
				killed = true
				break
			}
		}
	}
}

// TestEnginesJoinAndLeave: engines added and removed while the router runs
// are used and dropped without restarting it; a departed engine is never
// picked, and a crashed one still registered costs no request.
func TestEnginesJoinAndLeave(t *testing.T) {
	c := startProduct(t, func(o *localcluster.Options) { o.Decode = 1 })
	url := c.RouterURL() + "/v1/completions"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ask := func(want string) {
		t.Helper()
		got, err := postStream(ctx, url, completion("join and leave", 6), nil)
		if err != nil || got.status != 200 || got.dones != 1 || len(got.texts) != 6 {
			t.Fatalf("request: %v status %d %s", err, got.status, got.body)
		}
		if e := got.header.Get("X-Connex-Decode-Engine"); want != "" && e != want {
			t.Fatalf("decoded on %s, want %s", e, want)
		}
	}
	ask("decode-0")
	// A non-streamed answer carries the request's record, without its
	// transfer id (the handle of its hold is no client's business: issue 29).
	status, ans, err := postJSON(ctx, url, map[string]any{"model": "connex-sim", "prompt": "the record", "max_tokens": 3})
	cx, _ := ans["connex"].(map[string]any)
	if _, leaked := cx["transfer_id"]; err != nil || status != 200 || leaked || cx["prefill_engine"] != "prefill-0" || cx["request_id"] == "" {
		t.Fatalf("non-streamed answer's connex record: %d %v %v", status, ans, err)
	}
	added, err := c.AddEngine(ctx, localcluster.RoleDecode)
	if err != nil {
		t.Fatal(err)
	}
	waitEngines(t, c)
	// A graceful stop withdraws the engine at once (engine.gone): from then
	// on every request decodes on the new engine.
	if err := c.Term("decode-0"); err != nil {
		t.Fatal(err)
	}
	waitEngines(t, c)
	for i := 0; i < 4; i++ {
		ask(added)
	}
	// A crashed engine stays registered until its TTL lapses; a request
	// sent to it meanwhile moves to a live engine.
	third, err := c.AddEngine(ctx, localcluster.RoleDecode)
	if err != nil {
		t.Fatal(err)
	}
	waitEngines(t, c)
	if err := c.Kill(added + "/engine"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		ask(third)
	}
	waitEngines(t, c)
}

// TestDeadEngineFreesItsHold: a decode engine dies mid-request while its
// connexd lives, and nobody resumes the request (the client gave up first):
// its request actor ends once the engine's registration lapses, or at once
// when the engine is restarted under the same name (a new instance), and
// the prefill blocks are freed then, not after retain_s (60 s).
func TestDeadEngineFreesItsHold(t *testing.T) {
	c := startProduct(t, nil)
	nc := connect(t, c.NATSURL())
	for _, restart := range []bool{false, true} {
		t.Run(fmt.Sprintf("restarted=%v", restart), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var victim string
			var faultErr error
			_, _ = postStream(ctx, c.RouterURL()+"/v1/completions", completion("nobody resumes this one", 200), func(i int, s *streamed) {
				if i == 4 {
					// Frozen, the engine cannot notice its client leave and
					// finish the request itself; then the client leaves.
					victim = s.header.Get("X-Connex-Decode-Engine")
					faultErr = c.Stop(victim + "/engine")
					cancel()
				}
			})
			if faultErr != nil || victim == "" {
				t.Fatalf("fault on %q: %v", victim, faultErr)
			}
			checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
				if n := sum(must2(scrapeAs(c.RouterURL()+"/metrics", c.AdminKey())), "connex_router_requests_in_flight"); n != 0 {
					return fmt.Errorf("the router still runs %v requests", n)
				}
				return nil
			})
			if err := c.Kill(victim + "/engine"); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			if held, err := prefillHeld(t, nc, c); err != nil || held == 0 {
				t.Fatalf("the hold must outlive the engine for a while: held %d (%v)", held, err)
			}
			if restart {
				rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := c.Restart(rctx, victim+"/engine")
				rcancel()
				if err != nil {
					t.Fatal(err)
				}
			}
			checkFor(t, 20*time.Second, 50*time.Millisecond, func() error {
				held, err := prefillHeld(t, nc, c)
				if err != nil || held != 0 {
					return fmt.Errorf("prefill blocks held: %d (%v)", held, err)
				}
				return nil
			})
			t.Logf("prefill blocks freed %v after the engine died (registration TTL 3 s or a restart, + grace 2 s; retain_s is 60 s)", time.Since(killed).Round(time.Millisecond))
			waitEngines(t, c)
		})
	}
}
