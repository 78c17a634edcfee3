package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// routerModels is what the router's /v1/models lists, and /ready's status.
func routerModels(t *testing.T, base string) (models []string, ready int) {
	t.Helper()
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil || list.Object != "list" {
		t.Fatalf("/v1/models: %v %+v", err, list)
	}
	for _, m := range list.Data {
		models = append(models, m.ID)
	}
	r, err := http.Get(base + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	return models, r.StatusCode
}

// TestEnginesTravelWithMembership: engines registered with their connexd
// reach the router through membership heartbeats, and leave it on
// engine.gone, when their registration lapses, and when their connexd dies.
func TestEnginesTravelWithMembership(t *testing.T) {
	router := startConnexd(t, "router", "--role", "router", "--http-listen", "127.0.0.1:0", "--cluster-preset", "local")
	if router.httpURL == "" {
		t.Fatal("the router's ready line has no http= URL")
	}
	p := startConnexd(t, "p1", "--role", "prefill", "--nats-url", router.natsURL, "--cluster-preset", "local")
	d := startConnexd(t, "d1", "--role", "decode", "--nats-url", router.natsURL, "--cluster-preset", "local")
	nc := connect(t, router.natsURL)
	if _, status := routerModels(t, router.httpURL); status != http.StatusServiceUnavailable {
		t.Fatalf("/ready with no engines: %d, want 503", status)
	}
	register := func(member, id, role string, ttlMs uint32) error {
		cli := &api.Client{NC: nc, Member: member}
		_, err := cli.RegisterEngine(ctx5(t), &messages.RegisterEngineRequest{TtlMs: ttlMs, Engine: &messages.EngineInfo{
			EngineId: id, Role: role, Model: "m1", BaseUrl: "http://127.0.0.1:1", BlocksTotal: 10, BlocksFree: 10}})
		return err
	}
	if err := register(p.member, "pe", "prefill", 60000); err != nil {
		t.Fatal(err)
	}
	if err := register(d.member, "de", "decode", 60000); err != nil {
		t.Fatal(err)
	}
	served := func(want bool) func() error {
		return func() error {
			models, status := routerModels(t, router.httpURL)
			if got := slices.Contains(models, "m1"); got != want || (status == http.StatusOK) != want {
				return fmt.Errorf("models %v, /ready %d; want m1 served=%v", models, status, want)
			}
			return nil
		}
	}
	checkFor(t, 5*time.Second, 20*time.Millisecond, served(true))

	// engine.gone withdraws the registration at once.
	if _, err := (&api.Client{NC: nc, Member: d.member}).EngineGone(ctx5(t), &messages.EngineGoneRequest{EngineId: "de"}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, 20*time.Millisecond, served(false))

	// A registration that is not renewed lapses after its TTL.
	start := time.Now()
	// (2 s: long enough that a starved machine still sees it served.)
	if err := register(d.member, "de", "decode", 2000); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, 10*time.Millisecond, served(true))
	checkFor(t, 10*time.Second, 20*time.Millisecond, served(false))
	if lapsed := time.Since(start); lapsed < 2*time.Second {
		t.Fatalf("the registration lapsed after %v, before its 2 s TTL", lapsed)
	}

	// An engine leaves with its connexd.
	if err := register(d.member, "de", "decode", 60000); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, 20*time.Millisecond, served(true))
	d.signal(9)
	checkFor(t, 5*time.Second, 20*time.Millisecond, served(false))

	// Bad registrations get clear errors and change nothing.
	for _, bad := range []*messages.RegisterEngineRequest{
		{},
		{Engine: &messages.EngineInfo{EngineId: "x", Role: "chef", Model: "m1", BaseUrl: "http://h:1"}},
		{Engine: &messages.EngineInfo{EngineId: "x", Role: "decode", Model: "m1", BaseUrl: "ftp://h"}},
		{Engine: &messages.EngineInfo{EngineId: "x", Role: "decode", Model: "m1", BaseUrl: "http://h:1/v1"}},
		{Engine: &messages.EngineInfo{EngineId: "x.y", Role: "decode", Model: "m1", BaseUrl: "http://h:1"}},
		{Engine: &messages.EngineInfo{EngineId: "x", Role: "decode", Model: "m1", BaseUrl: "http://h:1"}, TtlMs: 10},
		// Another machine's address (issue 44): the router would post
		// clients' prompts there.
		{Engine: &messages.EngineInfo{EngineId: "x", Role: "prefill", Model: "m1", BaseUrl: "http://192.0.2.7:8100"}},
		{Engine: &messages.EngineInfo{EngineId: "x", Role: "prefill", Model: "m1", BaseUrl: "http://169.254.169.254"}},
	} {
		_, err := (&api.Client{NC: nc, Member: p.member}).RegisterEngine(ctx5(t), bad)
		if api.CodeOf(err) != api.CodeBadRequest {
			t.Errorf("register %v: %v, want bad_request", bad, err)
		}
	}
}
