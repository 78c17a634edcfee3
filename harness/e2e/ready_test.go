package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// TestReadyFollowsEngineDeath: the last decode engine is killed (its
// connexd lives). Its connexd sees the engine's port refuse and withdraws
// it at once, so the router's /ready turns 503 and its engine list drops
// the engine together — because the engine left, not because its
// registration lapsed (3 s later, the old behaviour: /ready said 200 and a
// request in that window got 503 "failed after 0 tokens").
func TestReadyFollowsEngineDeath(t *testing.T) {
	c := startProduct(t, func(o *localcluster.Options) { o.Decode = 1 })
	waitEngines(t, c)
	base := c.RouterURL()
	if _, status := routerModels(t, base); status != http.StatusOK {
		t.Fatalf("/ready before the kill: %d", status)
	}
	// The decode member has seen the engine listen (before that, a refused
	// port may be an engine still starting, and only the TTL ends it).
	checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if !strings.Contains(c.Logs("decode-0/connexd"), "engine listening") {
			return fmt.Errorf("decode-0's connexd has not seen its engine listen")
		}
		return nil
	})
	if err := c.Kill("decode-0/engine"); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		r, err := http.Get(base + "/ready")
		if err != nil {
			return err
		}
		r.Body.Close()
		if r.StatusCode != http.StatusServiceUnavailable {
			return fmt.Errorf("/ready %d after the last decode engine died", r.StatusCode)
		}
		return nil
	})
	// At the moment /ready says 503: the engine list agrees, and the decode
	// member withdrew the engine because its process was gone, before its
	// registration could lapse.
	status, _, body := httpDo(t, "GET", base+"/connex/v1/engines", c.AdminKey(), "")
	if status != http.StatusOK || strings.Contains(body, `"decode-0"`) {
		t.Fatalf("engines when /ready is 503: %d %s", status, body)
	}
	logs := c.Logs("decode-0/connexd")
	if !strings.Contains(logs, "refuses connections") || strings.Contains(logs, "registration lapsed") {
		t.Fatalf("the decode member did not withdraw its dead engine before its registration lapsed:\n%s", logs)
	}
}
