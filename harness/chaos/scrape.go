package chaos

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
)

var doubleFreeRe = regexp.MustCompile(`(?m)^connex_double_frees_total (\d+)`)

// doubleFrees scrapes connex_double_frees_total from every connexd.
func (r *run) doubleFrees(ctx context.Context) map[string]int {
	out := map[string]int{}
	targets := []string{"router"}
	for i := range r.sc.Nodes.Prefill {
		targets = append(targets, nodeName("prefill", i)+"/connexd")
	}
	for i := range r.sc.Nodes.Decode {
		targets = append(targets, nodeName("decode", i)+"/connexd")
	}
	for _, t := range targets {
		url, err := r.c.ReadyField(t, "metrics")
		if err != nil || url == "" {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		req, _ := http.NewRequestWithContext(cctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if m := doubleFreeRe.FindSubmatch(body); m != nil {
				n, _ := strconv.Atoi(string(m[1]))
				out[t] = n
			}
		}
		cancel()
	}
	return out
}

var (
	routerPrefillsRe     = regexp.MustCompile(`(?m)^connex_router_prefills_total\{[^}]*\} (\d+)`)
	routerFalseResumesRe = regexp.MustCompile(`(?m)^connex_router_false_resumes_total\{reason="([^"]*)"\} (\d+)`)
)

// routerMetrics reads the router's /metrics (nil if it cannot).
func (r *run) routerMetrics(ctx context.Context) []byte {
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(cctx, http.MethodGet, r.c.RouterURL()+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+r.c.AdminKey()) // the router's /metrics is an admin endpoint
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil
	}
	return body
}

// routerPrefills reads connex_router_prefills_total from the router; -1 if
// it cannot.
func (r *run) routerPrefills(ctx context.Context) int {
	body := r.routerMetrics(ctx)
	if body == nil {
		return -1
	}
	n := 0
	for _, m := range routerPrefillsRe.FindAllSubmatch(body, -1) {
		v, _ := strconv.Atoi(string(m[1]))
		n += v
	}
	return n
}

// routerFalseResumes reads connex_router_false_resumes_total from the
// router by reason; nil if it cannot.
func (r *run) routerFalseResumes(ctx context.Context) map[string]int {
	body := r.routerMetrics(ctx)
	if body == nil {
		return nil
	}
	out := map[string]int{}
	for _, m := range routerFalseResumesRe.FindAllSubmatch(body, -1) {
		v, _ := strconv.Atoi(string(m[2]))
		out[string(m[1])] += v
	}
	return out
}

// faultedRouter reports whether a fault hit the router (its counters then
// restart from zero).
func (r *run) faultedRouter() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.faults {
		if f.Resolved == "router" {
			return true
		}
	}
	return false
}

// faultedRouterOrPrefill reports whether a fault hit the router or a
// prefill node (then the router's prefill count may include retries or
// restart from zero).
func (r *run) faultedRouterOrPrefill() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.faults {
		if f.Resolved == "router" || strings.HasPrefix(f.Resolved, "prefill-") || f.Action == ActNATSRestart {
			return true
		}
	}
	return false
}
