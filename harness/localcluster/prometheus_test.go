package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"go.yaml.in/yaml/v3"
)

// families are the metric families of one scrape.
type families map[string]*dto.MetricFamily

// value is the value of the counter or gauge name whose label has value
// labelValue ("" label: the series without labels).
func (f families) value(name, label, labelValue string) (float64, bool) {
	mf, ok := f[name]
	if !ok {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		match := label == ""
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == labelValue {
				match = true
			}
		}
		if !match {
			continue
		}
		if m.Counter != nil {
			return m.GetCounter().GetValue(), true
		}
		return m.GetGauge().GetValue(), true
	}
	return 0, false
}

// scrape GETs a /metrics URL (with key as a bearer token, if any) and
// parses the answer as Prometheus text, failing t unless it is that.
func scrape(t *testing.T, url, key string) families {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); resp.StatusCode != http.StatusOK || ct != "text/plain" {
		t.Fatalf("GET %s: %s, Content-Type %q", url, resp.Status, resp.Header.Get("Content-Type"))
	}
	var p expfmt.TextParser
	f, err := p.TextToMetricFamilies(resp.Body)
	if err != nil || len(f) == 0 {
		t.Fatalf("GET %s: not Prometheus text (%d families): %v", url, len(f), err)
	}
	return f
}

// promConfig is the part of prometheus.yml the cluster writes.
type promConfig struct {
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		Authorization struct {
			CredentialsFile string `yaml:"credentials_file"`
		} `yaml:"authorization"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
		FileSDConfigs []struct {
			Files []string `yaml:"files"`
		} `yaml:"file_sd_configs"`
	} `yaml:"scrape_configs"`
}

// scrapeTargets reads the Prometheus configuration at path and returns
// each scraped address with the credentials file its job sends ("" for
// none).
func scrapeTargets(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var conf promConfig
	if err := yaml.Unmarshal(b, &conf); err != nil {
		t.Fatalf("%s: %v\n%s", path, err, b)
	}
	out := map[string]string{}
	for _, sc := range conf.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				out[target] = sc.Authorization.CredentialsFile
			}
		}
		for _, sd := range sc.FileSDConfigs {
			for _, file := range sd.Files {
				b, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				var groups []promTargetGroup
				if err := json.Unmarshal(b, &groups); err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				for _, g := range groups {
					for _, target := range g.Targets {
						out[target] = sc.Authorization.CredentialsFile
					}
				}
			}
		}
	}
	return out
}

// wantScrapeTargets is what scrapeTargets should find for c's
// MetricsTargets.
func wantScrapeTargets(c *Cluster) map[string]string {
	want := map[string]string{}
	for _, m := range c.MetricsTargets() {
		want[hostPort(m.URL)] = ""
		if m.Admin {
			want[hostPort(m.URL)] = c.AdminKeyFile()
		}
	}
	return want
}

// TestLocalFakePrometheusConfig: with Options.Metrics every connexd serves
// metrics; MetricsTargets lists them with the router's and the engines';
// the scrape configuration names exactly those (the router's with the
// admin key file), and follows a restarted process to its new port.
func TestLocalFakePrometheusConfig(t *testing.T) {
	needProc(t)
	o, log := fakeRestarting(t, RestartPolicy{After: 10 * time.Millisecond})
	o.Metrics = true
	c, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var procs []string
	for _, m := range c.MetricsTargets() {
		procs = append(procs, m.Process)
		if !strings.HasPrefix(m.URL, "http://127.0.0.1:") || !strings.HasSuffix(m.URL, "/metrics") || m.Admin != (m.Process == RouterName) {
			t.Errorf("target %+v", m)
		}
	}
	want := []string{"router", "router/connexd", "prefill-0/connexd", "prefill-0/engine", "decode-0/connexd", "decode-0/engine", "decode-1/connexd", "decode-1/engine"}
	if !slices.Equal(procs, want) {
		t.Errorf("MetricsTargets processes %q, want %q", procs, want)
	}
	path, err := c.WritePrometheusConfig()
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(c.Dir(), "prometheus.yml") {
		t.Errorf("config at %s", path)
	}
	if got, want := scrapeTargets(t, path), wantScrapeTargets(c); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("scrape targets %v, want %v", got, want)
	}

	// A restarted connexd listens on a new port: the targets follow.
	before := c.MetricsTargets()
	if err := c.Kill("decode-1/connexd"); err != nil {
		t.Fatal(err)
	}
	ev := log.waitPhase(t, "decode-1/connexd", Restarted)
	i := slices.IndexFunc(before, func(m MetricsTarget) bool { return m.Process == "decode-1/connexd" })
	if ev.Metrics == "" || ev.Metrics == before[i].URL {
		t.Fatalf("restarted connexd's metrics %q (was %s)", ev.Metrics, before[i].URL)
	}
	got := scrapeTargets(t, path)
	if _, ok := got[hostPort(ev.Metrics)]; !ok || fmt.Sprint(got) != fmt.Sprint(wantScrapeTargets(c)) {
		t.Errorf("after the restart: scrape targets %v, want %v with %s", got, wantScrapeTargets(c), ev.Metrics)
	}
}
