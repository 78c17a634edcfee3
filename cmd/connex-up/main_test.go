package main

import (
	"io"
	"slices"
	"testing"
	"time"
)

func TestParseFlagsDefaults(t *testing.T) {
	o, quiet, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if quiet || o.Connexd != "./bin/connexd" || o.Sim != "./bin/connex-sim" || o.RouterHTTP != "127.0.0.1:8000" ||
		o.Prefill != 1 || o.Decode != 2 || o.Layout != "small" || o.PrefillPerToken != 50*time.Microsecond ||
		o.DecodePerToken != 20*time.Millisecond || o.NATSURL != "" {
		t.Errorf("defaults: %+v quiet=%v", o, quiet)
	}
}

func TestParseFlags(t *testing.T) {
	o, quiet, err := parseFlags([]string{"--connexd", "/c", "--sim", "/s", "--http", "127.0.0.1:9000", "--decode", "3",
		"--decode-ms-per-token", "5", "--prefill-us-per-token", "0", "--connexd-arg=--retain-s=5",
		"--connexd-arg", "--kv-load-failure-policy=recompute", "--quiet"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !quiet || o.Connexd != "/c" || o.Sim != "/s" || o.RouterHTTP != "127.0.0.1:9000" || o.Decode != 3 ||
		o.DecodePerToken != 5*time.Millisecond || o.PrefillPerToken != 0 ||
		!slices.Equal(o.ConnexdArgs, []string{"--retain-s=5", "--kv-load-failure-policy=recompute"}) {
		t.Errorf("parsed %+v quiet=%v", o, quiet)
	}
	for _, bad := range [][]string{{"--decode", "0"}, {"--prefill", "-1"}, {"--decode-ms-per-token", "-1"}, {"extra"}, {"--nope"}} {
		if _, _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q): want an error", bad)
		}
	}
}

func TestParseFlagsEngineUser(t *testing.T) {
	for arg, want := range map[string][2]uint32{"65534": {65534, 65534}, "1000:2000": {1000, 2000}} {
		o, _, err := parseFlags([]string{"--engine-user", arg}, io.Discard)
		if err != nil || o.EngineUser == nil || o.EngineUser.UID != want[0] || o.EngineUser.GID != want[1] {
			t.Errorf("--engine-user %s: %+v %v", arg, o.EngineUser, err)
		}
	}
	if o, _, _ := parseFlags(nil, io.Discard); o.EngineUser != nil {
		t.Errorf("no --engine-user: %+v", o.EngineUser)
	}
	for _, bad := range [][]string{{"--engine-user", "nobody"}, {"--engine-user", "1:x"}, {"--engine-user", "-1"},
		{"--engine-user", "1", "--vllm", "vllm"}} {
		if _, _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q): want an error", bad)
		}
	}
}
