package localcluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
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
