package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"go/build"
	"io"
	"mime"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
	"github.com/connex/connex/harness/poll"
	"github.com/prometheus/common/expfmt"
)

// screen collects what connex-up prints, line by line.
type screen struct {
	mu    sync.Mutex
	lines []string
}

func (s *screen) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		s.mu.Lock()
		s.lines = append(s.lines, sc.Text())
		s.mu.Unlock()
	}
}

func (s *screen) text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

// waitFor waits until a printed line matches re and returns its groups.
func (s *screen) waitFor(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	var m []string
	poll.Until(t, 3*time.Minute, 10*time.Millisecond, func() error {
		if m = re.FindStringSubmatch(s.text()); m == nil {
			return fmt.Errorf("no line matches %s in:\n%s", re, s.text())
		}
		return nil
	})
	return m
}

// TestConnexUp runs connex-up on the real binaries as `make run` does and
// follows what it prints: every /metrics URL answers Prometheus text (the
// router's with the admin key), the scrape configuration names them all,
// `connexd status` reaches the cluster with nothing but the env file's
// variables (and `nats micro ls` lists connex, when the nats CLI is
// here), and a decode engine killed with the printed command comes back
// under a new pid that the restart line names. The shell it runs in still
// has another cluster's variables: the processes must not use them.
func TestConnexUp(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil || testing.Short() {
		t.Skip("starts real processes (Linux)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bins, err := localcluster.Build(ctx, t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Setenv("CONNEX_NATS_URL", "nats://127.0.0.1:1")
	t.Setenv("CONNEX_NATS_CREDS", filepath.Join(dir, "stale.creds"))
	nats := natsForTest()
	stable := filepath.Join(dir, "run", "connex-up.env")
	runCtx, stop := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	var out screen
	go out.read(pr)
	code := make(chan int, 1)
	go func() {
		code <- run(runCtx, []string{"--connexd", bins.Connexd, "--sim", bins.Sim, "--http", "127.0.0.1:0", "--quiet",
			"--decode-ms-per-token", "1", "--restart-after", "100ms", "--env-file", stable, "--nats-cli", nats}, pw, &testWriter{t: t})
		pw.Close()
	}()
	defer func() {
		stop()
		if c := <-code; c != 0 {
			t.Errorf("connex-up exit code %d", c)
		}
		if _, err := os.Stat(stable); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the env file %s outlived connex-up: %v", stable, err)
		}
	}()
	out.waitFor(t, regexp.MustCompile(`(?m)^Ctrl-C stops every process\.$`))
	banner := out.text()

	// The env file, sourced as the banner says.
	envFile := out.waitFor(t, regexp.MustCompile(`(?m)^  \. (\S+)$`))[1]
	if envFile != stable {
		t.Errorf("the banner sources %s, want %s", envFile, stable)
	}
	env := readEnvFile(t, envFile)

	// Every metrics URL answers Prometheus text; the scrape config names
	// each.
	promConf := out.waitFor(t, regexp.MustCompile(`(?m)^  prometheus --config\.file=(\S+)$`))[1]
	conf, _ := os.ReadFile(promConf)
	targets, _ := os.ReadFile(filepath.Join(filepath.Dir(promConf), "prometheus-targets.json"))
	adminKey, err := os.ReadFile(env["CONNEX_ADMIN_KEY_FILE"])
	if err != nil {
		t.Fatal(err)
	}
	urls := regexp.MustCompile(`(?m)^  (\S+)\s+(http://(127\.0\.0\.1:\d+)/metrics)`).FindAllStringSubmatch(banner, -1)
	if len(urls) != 8 { // the router's front door and its connexd, and 3 × (connexd, engine)
		t.Errorf("%d metrics URLs printed, want 8:\n%s", len(urls), banner)
	}
	for _, u := range urls {
		key := ""
		if u[1] == "router" {
			key = strings.TrimSpace(string(adminKey))
		}
		if err := promText(u[2], key); err != nil {
			t.Errorf("%s: %v", u[1], err)
		}
		if !strings.Contains(string(conf)+string(targets), "'"+u[3]+"'") && !strings.Contains(string(targets), `"`+u[3]+`"`) {
			t.Errorf("the scrape configuration does not name %s (%s):\n%s\n%s", u[3], u[1], conf, targets)
		}
	}

	// connexd status with only the env file's variables, away from any
	// connex-data directory.
	status := exec.CommandContext(ctx, bins.Connexd, "status")
	status.Env, status.Dir = envList(env), t.TempDir()
	if b, err := status.CombinedOutput(); err != nil || !strings.Contains(string(b), "decode-1") || !strings.Contains(string(b), "prefill-0") {
		t.Errorf("connexd status with %v: %v\n%s", status.Env, err, b)
	}
	if nats != "" {
		if !strings.Contains(banner, "  "+nats+" micro ls") {
			t.Errorf("the banner does not name %s micro ls:\n%s", nats, banner)
		}
		ls := exec.CommandContext(ctx, nats, "micro", "ls")
		ls.Env, ls.Dir = append(envList(env), "HOME="+t.TempDir()), t.TempDir()
		if b, err := ls.CombinedOutput(); err != nil || !strings.Contains(string(b), "connex") {
			t.Errorf("nats micro ls with %v: %v\n%s", ls.Env, err, b)
		}
	} else {
		t.Log("no nats CLI here: nats micro ls not tried")
	}

	// Kill a decode engine with the printed command: it comes back.
	kill := out.waitFor(t, regexp.MustCompile(`(?m)^  kill -9 (\d+)\s+# decode-0's connex-sim$`))
	old, _ := strconv.Atoi(kill[1])
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	back := out.waitFor(t, regexp.MustCompile(`(?m)^connex-up: decode-0/engine is back: pid (\d+) \(was `+kill[1]+`, signal: killed\), http://\S+, metrics (http://\S+/metrics); again: kill -9 (\d+)$`))
	if back[1] != back[3] || back[1] == kill[1] {
		t.Errorf("restart line names pid %s and kill -9 %s (old pid %s)", back[1], back[3], kill[1])
	}
	if pid, _ := strconv.Atoi(back[1]); syscall.Kill(pid, 0) != nil {
		t.Errorf("the restarted engine's pid %d does not run", pid)
	}
	if err := promText(back[2], ""); err != nil {
		t.Errorf("the restarted engine's metrics: %v", err)
	}
}

// natsForTest is a nats CLI to try (on PATH, or go install's), or "".
func natsForTest() string {
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	if p := filepath.Join(build.Default.GOPATH, "bin", "nats"); fileExists(p) {
		return p
	}
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// readEnvFile reads the `export NAME='value'` lines of a file connex-up
// wrote.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		kv, ok := strings.CutPrefix(line, "export ")
		if !ok {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		env[k] = strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(v, "'"), "'"), `'\''`, "'")
	}
	for _, k := range []string{"CONNEX_NATS_URL", "CONNEX_NATS_CREDS", "NATS_URL", "NATS_CREDS", "CONNEX_ROUTER_URL", "CONNEX_ADMIN_KEY_FILE"} {
		if env[k] == "" {
			t.Errorf("%s sets no %s:\n%s", path, k, b)
		}
	}
	return env
}

func envList(env map[string]string) []string {
	var out []string
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// promText GETs url (with key as a bearer token, if any) and checks that
// the answer is Prometheus text with at least one metric family.
func promText(url, key string) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); resp.StatusCode != http.StatusOK || ct != "text/plain" {
		return fmt.Errorf("GET %s: %s, Content-Type %q", url, resp.Status, resp.Header.Get("Content-Type"))
	}
	var p expfmt.TextParser
	f, err := p.TextToMetricFamilies(resp.Body)
	if err != nil || len(f) == 0 {
		return fmt.Errorf("GET %s: not Prometheus text (%d families): %v", url, len(f), err)
	}
	return nil
}

// testWriter sends connex-up's stderr to t.Log (run returns before the
// test ends).
type testWriter struct{ t *testing.T }

func (w *testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}
