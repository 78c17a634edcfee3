package main

import (
	"io"
	"slices"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

func TestParseFlagsDefaults(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/4242")
	f, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o := f.opts
	if f.quiet || o.Connexd != "./bin/connexd" || o.Sim != "./bin/connex-sim" || o.RouterHTTP != "127.0.0.1:8000" ||
		o.Prefill != 1 || o.Decode != 2 || o.Layout != "small" || o.PrefillPerToken != 50*time.Microsecond ||
		o.DecodePerToken != 20*time.Millisecond || o.NATSURL != "" {
		t.Errorf("defaults: %+v quiet=%v", o, f.quiet)
	}
	// make run restarts what dies, serves every connexd's metrics and
	// writes the env file where a second shell finds it.
	if o.Restart != localcluster.DefaultRestart || !o.Metrics || f.envFile != "/run/user/4242/connex-up.env" || f.natsCLI != "./bin/nats" {
		t.Errorf("defaults: restart %+v metrics %v env file %q nats %q", o.Restart, o.Metrics, f.envFile, f.natsCLI)
	}
}

func TestParseFlags(t *testing.T) {
	f, err := parseFlags([]string{"--connexd", "/c", "--sim", "/s", "--http", "127.0.0.1:9000", "--decode", "3",
		"--decode-ms-per-token", "5", "--prefill-us-per-token", "0", "--connexd-arg=--retain-s=5",
		"--connexd-arg", "--kv-load-failure-policy=recompute", "--quiet", "--restart-after", "0", "--env-file", "",
		"--nats-cli", "/usr/bin/nats"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o := f.opts
	if !f.quiet || o.Connexd != "/c" || o.Sim != "/s" || o.RouterHTTP != "127.0.0.1:9000" || o.Decode != 3 ||
		o.DecodePerToken != 5*time.Millisecond || o.PrefillPerToken != 0 ||
		!slices.Equal(o.ConnexdArgs, []string{"--retain-s=5", "--kv-load-failure-policy=recompute"}) ||
		o.Restart.Enabled() || f.envFile != "" || f.natsCLI != "/usr/bin/nats" {
		t.Errorf("parsed %+v %+v", o, f)
	}
	if f, err := parseFlags([]string{"--restart-after", "250ms"}, io.Discard); err != nil || f.opts.Restart.After != 250*time.Millisecond {
		t.Errorf("--restart-after 250ms: %+v, %v", f.opts.Restart, err)
	}
	for _, bad := range [][]string{{"--decode", "0"}, {"--prefill", "-1"}, {"--decode-ms-per-token", "-1"}, {"extra"}, {"--nope"},
		{"--restart-after", "-1s"}, {"--restart-after", "soon"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q): want an error", bad)
		}
	}
}

func TestParseFlagsEngineUser(t *testing.T) {
	for arg, want := range map[string][2]uint32{"65534": {65534, 65534}, "1000:2000": {1000, 2000}} {
		f, err := parseFlags([]string{"--engine-user", arg}, io.Discard)
		if u := f.opts.EngineUser; err != nil || u == nil || u.UID != want[0] || u.GID != want[1] {
			t.Errorf("--engine-user %s: %+v %v", arg, u, err)
		}
	}
	if f, _ := parseFlags(nil, io.Discard); f.opts.EngineUser != nil {
		t.Errorf("no --engine-user: %+v", f.opts.EngineUser)
	}
	for _, bad := range [][]string{{"--engine-user", "nobody"}, {"--engine-user", "1:x"}, {"--engine-user", "-1"},
		{"--engine-user", "1", "--vllm", "vllm"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q): want an error", bad)
		}
	}
}

func TestParseFlagsEngineLogs(t *testing.T) {
	f, err := parseFlags([]string{"--vllm", "vllm", "--vllm-model", "m", "--engine-log-dir", "/var/log/x"}, io.Discard)
	if err != nil || f.opts.VLLM == nil || f.opts.VLLM.LogDir != "/var/log/x" {
		t.Fatalf("vLLM engines log to files by default: %+v %v", f.opts.VLLM, err)
	}
	if f, err = parseFlags([]string{"--vllm", "vllm", "--vllm-model", "m"}, io.Discard); err != nil || f.opts.VLLM.LogDir == "" {
		t.Fatalf("the default log dir: %+v %v", f.opts.VLLM, err)
	}
	f, err = parseFlags([]string{"--vllm", "vllm", "--vllm-model", "m", "--engine-logs"}, io.Discard)
	if err != nil || f.opts.VLLM.LogDir != "" {
		t.Fatalf("--engine-logs brings them to the screen: %+v %v", f.opts.VLLM, err)
	}
	if _, err := parseFlags([]string{"--vllm", "vllm", "--vllm-model", "m", "--engine-log-dir", ""}, io.Discard); err == nil {
		t.Fatal("an empty --engine-log-dir: want an error")
	}
}

func TestParseFlagsConnectorSettings(t *testing.T) {
	f, err := parseFlags([]string{"--vllm", "vllm", "--vllm-model", "m", "--vllm-connector", "idle_wait_ms=0", "--vllm-connector", "release=after_pull"}, io.Discard)
	if err != nil || f.opts.VLLM.Connector["idle_wait_ms"] != float64(0) || f.opts.VLLM.Connector["release"] != "after_pull" {
		t.Fatalf("settings: %+v %v", f.opts.VLLM, err)
	}
	for _, bad := range [][]string{{"--vllm", "vllm", "--vllm-connector", "novalue"}, {"--vllm-connector", "a=1"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q): want an error", bad)
		}
	}
}

func TestParseFlagsTensorParallel(t *testing.T) {
	f, err := parseFlags([]string{"--vllm", "vllm", "--vllm-model", "m", "--prefill-tp", "2", "--decode-tp", "4"}, io.Discard)
	if err != nil || f.opts.VLLM.PrefillTP != 2 || f.opts.VLLM.DecodeTP != 4 {
		t.Fatalf("--prefill-tp 2 --decode-tp 4: %+v %v", f.opts.VLLM, err)
	}
	for _, bad := range [][]string{{"--prefill-tp", "2"}, {"--vllm", "vllm", "--decode-tp", "0"}, {"--vllm", "vllm", "--prefill-tp", "-1"}} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q): want an error", bad)
		}
	}
}
