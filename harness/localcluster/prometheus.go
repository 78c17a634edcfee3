package localcluster

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
)

// MetricsTarget is one Prometheus /metrics endpoint of the cluster.
type MetricsTarget struct {
	// Process names what serves it: "router" (the router's HTTP front
	// door, connex_router_* series), "router/connexd", "decode-0/connexd"
	// (a connexd's metrics_listen, with Options.Metrics) or
	// "decode-0/engine" (the engine's own, on its HTTP port).
	Process string
	// URL is the endpoint, e.g. http://127.0.0.1:8000/metrics.
	URL string
	// Admin says the endpoint takes the admin key (AdminKeyFile) as
	// "Authorization: Bearer <key>".
	Admin bool
}

// MetricsTargets lists every /metrics endpoint of the cluster's current
// processes: the router's front door, its connexd, then per engine in
// start order its connexd and the engine. A connexd's is listed only when
// it serves one (Options.Metrics); a restarted process is listed at its new
// address.
func (c *Cluster) MetricsTargets() []MetricsTarget {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []MetricsTarget
	if c.routerURL != "" {
		out = append(out, MetricsTarget{Process: RouterName, URL: c.routerURL + "/metrics", Admin: true})
	}
	connexd := func(name string, p *process) {
		if p == nil {
			return
		}
		p.mu.Lock()
		url := p.fields["metrics"]
		p.mu.Unlock()
		if url != "" {
			out = append(out, MetricsTarget{Process: name + "/" + string(PartConnexd), URL: url})
		}
	}
	connexd(RouterName, c.router)
	for _, name := range c.order {
		n := c.nodes[name]
		connexd(name, n.connexd)
		if n.url != "" {
			out = append(out, MetricsTarget{Process: processName(name, PartEngine), URL: n.url + "/metrics"})
		}
	}
	return out
}

// Scrape-configuration files WritePrometheusConfig writes in Dir.
const (
	prometheusConfigFile  = "prometheus.yml"
	prometheusTargetsFile = "prometheus-targets.json"
)

// WritePrometheusConfig writes a Prometheus configuration that scrapes
// every MetricsTargets endpoint every 5 s, and returns its path
// (<Dir>/prometheus.yml; `prometheus --config.file=<path>`). The router's
// job sends the admin key (credentials_file: AdminKeyFile); the other
// endpoints are in <Dir>/prometheus-targets.json (file_sd_configs), which
// the cluster rewrites whenever Options.Restart brings a process back on a
// new port, and Prometheus re-reads on its own. Each series carries a
// process label ("decode-0/engine", …).
func (c *Cluster) WritePrometheusConfig() (string, error) {
	path := filepath.Join(c.dir, prometheusConfigFile)
	targets := filepath.Join(c.dir, prometheusTargetsFile)
	router := hostPort(c.RouterURL())
	conf := fmt.Sprintf(`# Prometheus scrape configuration of the local Connex cluster in %s.
#   prometheus --config.file=%s
# The router's /metrics takes its admin key; every other endpoint is in
# %s, rewritten when a process restarts on a new port.
global:
  scrape_interval: 5s
scrape_configs:
  - job_name: connex-router
    authorization:
      credentials_file: %s
    static_configs:
      - targets: [%s]
        labels:
          process: router
  - job_name: connex
    file_sd_configs:
      - files: [%s]
`, c.dir, path, targets, yamlQuote(c.AdminKeyFile()), yamlQuote(router), yamlQuote(targets))
	if err := c.writePrometheusTargets(); err != nil {
		return "", err
	}
	if err := writeFileAtomic(path, []byte(conf), 0o644); err != nil {
		return "", err
	}
	c.mu.Lock()
	c.promTargets = true
	c.mu.Unlock()
	return path, nil
}

// promTargetGroup is one entry of a Prometheus file_sd file.
type promTargetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels"`
}

// writePrometheusTargets writes every endpoint but the router's front door
// as file_sd target groups.
func (c *Cluster) writePrometheusTargets() error {
	groups := []promTargetGroup{}
	for _, t := range c.MetricsTargets() {
		if t.Admin {
			continue
		}
		groups = append(groups, promTargetGroup{Targets: []string{hostPort(t.URL)}, Labels: map[string]string{"process": t.Process}})
	}
	b, err := json.MarshalIndent(groups, "", "  ")
	if err != nil {
		return fmt.Errorf("localcluster: Prometheus targets: %w", err)
	}
	return writeFileAtomic(filepath.Join(c.dir, prometheusTargetsFile), append(b, '\n'), 0o644)
}

// yamlQuote is s as a single-quoted YAML scalar.
func yamlQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
