package localcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"
)

// Ready-line prefixes the binaries print on stdout once they serve.
const (
	connexdReady = "connexd ready"
	simReady     = "connex-sim ready"
)

// parseReady reads the key=value fields of a ready line that starts with
// prefix (e.g. "connexd ready member=m nats=nats://… role=router").
func parseReady(line, prefix string) (map[string]string, bool) {
	rest, ok := strings.CutPrefix(line, prefix)
	if !ok || (rest != "" && rest[0] != ' ') {
		return nil, false
	}
	fields := map[string]string{}
	for _, f := range strings.Fields(rest) {
		if k, v, ok := strings.Cut(f, "="); ok && k != "" {
			fields[k] = v
		}
	}
	return fields, true
}

// hostPort is the host:port of an http:// or nats:// URL.
func hostPort(url string) string {
	_, rest, ok := strings.Cut(url, "://")
	if !ok {
		rest = url
	}
	hp, _, _ := strings.Cut(rest, "/")
	return hp
}

// pollReady asks url until it answers 200, ctx ends, or dead is closed
// (the server exited). every is the interval between two asks.
func pollReady(ctx context.Context, url string, every time.Duration, dead <-chan struct{}) error {
	client := &http.Client{Timeout: 2 * time.Second}
	last := "no answer yet"
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("GET %s: %w", url, err)
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
		} else if ctx.Err() == nil { // keep the server's last answer over our own deadline
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("GET %s not 200 (%w); last answer: %s", url, ctx.Err(), last)
		case <-dead:
			return fmt.Errorf("GET %s: the server exited; last answer: %s", url, last)
		case <-t.C:
		}
	}
}

// routerEngine is one entry of the router's GET /connex/v1/engines.
type routerEngine struct {
	EngineID string `json:"engine_id"`
	BaseURL  string `json:"base_url"`
	Suspect  bool   `json:"suspect"`
}

// enginesDiff says how the engines the router lists (live ones: not
// suspect) differ from want (engine id → base URL); "" when they agree.
func enginesDiff(listed []routerEngine, want map[string]string) string {
	var diffs []string
	seen := map[string]bool{}
	for _, e := range listed {
		if e.Suspect {
			continue
		}
		seen[e.EngineID] = true
		switch url, ok := want[e.EngineID]; {
		case !ok:
			diffs = append(diffs, "lists "+e.EngineID+" that is not running")
		case url != e.BaseURL:
			diffs = append(diffs, fmt.Sprintf("lists %s at %s, it serves at %s", e.EngineID, e.BaseURL, url))
		}
	}
	for id := range want {
		if !seen[id] {
			diffs = append(diffs, "does not list "+id)
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "; ")
}

// errNoEngineList means the router has no GET /connex/v1/engines.
var errNoEngineList = errors.New("the router lists no engines (404)")

// getEngines reads the router's engine list (with adminKey, base URLs
// included).
func getEngines(ctx context.Context, client *http.Client, url, adminKey string) ([]routerEngine, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if adminKey != "" {
		req.Header.Set("Authorization", "Bearer "+adminKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return nil, errNoEngineList
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	var out []routerEngine
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return out, nil
}
