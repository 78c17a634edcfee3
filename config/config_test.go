package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/natssubject"
)

func TestDefaults(t *testing.T) {
	c, err := Load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Backend != "auto" || c.Release != "on_finish" || c.Retain != 60*time.Second || c.KVLoadFailurePolicy != "fail" || c.NATSURL != "" {
		t.Fatalf("defaults: %+v", c)
	}
	if c.MemberID == "" {
		t.Fatal("member id must default to something")
	}
	if c.UCXReads != "checked" {
		t.Fatalf("ucx_reads defaults to %q, want checked", c.UCXReads)
	}
	if c.OrphanScan != time.Second || c.OrphanIdleScan != 30*time.Second {
		t.Fatalf("orphan scans every %v, %v when idle; want 1s, 30s", c.OrphanScan, c.OrphanIdleScan)
	}
}

func TestUCXReads(t *testing.T) {
	c, err := Load([]string{"--ucx-reads", "onesided"}, nil)
	if err != nil || c.UCXReads != "onesided" {
		t.Fatalf("--ucx-reads onesided: %q, %v", c.UCXReads, err)
	}
	if c.UCXSharedReads != "map" {
		t.Fatalf("ucx_shared_reads defaults to %q, want map", c.UCXSharedReads)
	}
	c, err = Load([]string{"--ucx-shared-reads", "get"}, nil)
	if err != nil || c.UCXSharedReads != "get" {
		t.Fatalf("--ucx-shared-reads get: %q, %v", c.UCXSharedReads, err)
	}
	if _, err := Load([]string{"--ucx-shared-reads", "mmap"}, nil); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `ucx_shared_reads="mmap", allowed: map, get`) {
		t.Fatalf("--ucx-shared-reads mmap: %v", err)
	}
	_, err = Load([]string{"--ucx-reads", "raw"}, nil)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `ucx_reads="raw", allowed: checked, onesided`) {
		t.Fatalf("--ucx-reads raw: %v", err)
	}
}

func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(file, []byte("retain_s: 10\nrelease: after_pull\nbackend: tcp\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load([]string{"--config", file}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Retain != 10*time.Second || c.Release != "after_pull" {
		t.Fatalf("file not applied: %+v", c)
	}
	c, err = Load([]string{"--config", file}, []string{"CONNEX_RETAIN_S=20", "CONNEX_BACKEND=auto", "PATH=/bin"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Retain != 20*time.Second || c.Backend != "auto" || c.Release != "after_pull" {
		t.Fatalf("env must beat the file: %+v", c)
	}
	c, err = Load([]string{"--config", file, "--retain-s", "30"}, []string{"CONNEX_RETAIN_S=20"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Retain != 30*time.Second {
		t.Fatalf("flags must beat the environment: %+v", c)
	}
}

func TestInvalidValuesNameTheKey(t *testing.T) {
	cases := []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"--backend", "rdma"}, nil, "backend=\"rdma\", allowed: auto, ucx, tcp"},
		{[]string{"--release", "never"}, nil, "release=\"never\", allowed: on_finish, after_pull"},
		{nil, []string{"CONNEX_RETAIN_S=-5"}, "retain_s=\"-5\""},
		{nil, []string{"CONNEX_RETAIN_S=abc"}, "retain_s=\"abc\""},
		{[]string{"--kv-load-failure-policy", "retry"}, nil, "kv_load_failure_policy=\"retry\", allowed: fail, recompute"},
		{[]string{"--role", "boss"}, nil, "role=\"boss\""},
		{[]string{"--member-id", "a b"}, nil, "member_id=\"a b\""},
		{[]string{"--js-replicas", "0"}, nil, "js_replicas=\"0\""},
		{[]string{"--no-such-flag"}, nil, "unknown flag"},
		{[]string{"--orphan-scan-ms", "5000", "--orphan-idle-scan-ms", "1000"}, nil, "orphan_idle_scan_ms=1000 is below orphan_scan_ms=5000"},
		{nil, []string{"CONNEX_ORPHAN_IDLE_SCAN_MS=0"}, "orphan_idle_scan_ms=\"0\""},
	}
	for _, c := range cases {
		_, err := Load(c.args, c.env)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: got %v, want it to mention %q", c.args, c.env, err, c.want)
		}
	}
}

func TestUnknownFileKey(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("retian_s: 10\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load([]string{"--config", file}, nil); err == nil || !strings.Contains(err.Error(), "retian_s") {
		t.Fatalf("a misspelt key must fail loudly, got %v", err)
	}
}

// TestRemoteAndDataTLSDefaults: with authentication on (the default)
// protoactor's remote and the TCP data plane speak mutual TLS; with it off
// and no credentials, auto means plaintext and on is refused.
func TestRemoteAndDataTLSDefaults(t *testing.T) {
	c, err := Load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.ClusterTLS != "auto" || c.DataTLS != "auto" || !c.HasCreds() || !c.RemoteTLS() {
		t.Fatalf("defaults: cluster_tls=%q data_tls=%q creds=%v remote TLS=%v", c.ClusterTLS, c.DataTLS, c.HasCreds(), c.RemoteTLS())
	}
	if c, err = Load([]string{"--cluster-tls", "off"}, nil); err != nil || c.RemoteTLS() {
		t.Fatalf("--cluster-tls off: remote TLS %v, %v", c.RemoteTLS(), err)
	}
	if c, err = Load([]string{"--nats-auth", "off"}, nil); err != nil || c.HasCreds() || c.RemoteTLS() {
		t.Fatalf("--nats-auth off: creds %v, remote TLS %v, %v", c.HasCreds(), c.RemoteTLS(), err)
	}
	if c, err = Load([]string{"--nats-url", "nats://x:4222", "--nats-creds", "m.creds"}, nil); err != nil || !c.RemoteTLS() {
		t.Fatalf("external server with credentials: remote TLS %v, %v", c.RemoteTLS(), err)
	}
	for _, args := range [][]string{
		{"--nats-auth", "off", "--cluster-tls", "on"},
		{"--nats-auth", "off", "--data-tls", "on"},
		{"--cluster-tls", "maybe"},
	} {
		if _, err := Load(args, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("%v: %v, want ErrInvalid", args, err)
		}
	}
}

func TestClaim(t *testing.T) {
	for _, c := range []struct {
		args []string
		want time.Duration
		bad  bool
	}{
		{nil, 15 * time.Second, false},
		{[]string{"--claim-s", "0"}, 0, false},
		{[]string{"--claim-s", "5"}, 5 * time.Second, false},
		{[]string{"--claim-s", "-1"}, 0, true},
		{[]string{"--claim-s", "x"}, 0, true},
	} {
		got, err := Load(c.args, nil)
		if (err != nil) != c.bad || (!c.bad && got.Claim != c.want) {
			t.Errorf("%v: claim %v err %v, want %v (error %v)", c.args, got.Claim, err, c.want, c.bad)
		}
	}
}

func TestListOrMapValueRefused(t *testing.T) {
	for _, body := range []string{
		"role: router\napi_key: [k1, k2]\n",
		"role: router\napi_key:\n  - k1\n",
		"role: decode\nnats_url: [nats://a:4222, nats://b:4222]\n",
	} {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Load([]string{"--config", path}, nil)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "must be a single value") {
			t.Errorf("%q: got %v, want a refusal of a list or map value", body, err)
		}
	}
	// A map is read as nested keys, refused as unknown.
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("nats_url:\n  primary: nats://a:4222\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load([]string{"--config", path}, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("a map for nats_url: got %v, want a refusal", err)
	}
	// The supported way to give several keys still works.
	path = filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("role: router\napi_key: \"k1, k2\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := Load([]string{"--config", path}, nil); err != nil || len(c.APIKeys) != 2 {
		t.Fatalf("comma-separated api_key: %v keys, %v", c.APIKeys, err)
	}
}

func TestPositionalArgumentRefused(t *testing.T) {
	for _, args := range [][]string{{"stauts"}, {"retain_s=5"}, {"--role", "decode", "extra"}} {
		_, err := Load(args, nil)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "unexpected argument") {
			t.Errorf("%q: got %v, want an unexpected-argument refusal", args, err)
		}
	}
}

func TestReservedMemberIDRefused(t *testing.T) {
	if _, err := Load([]string{"--member-id", "engine"}, nil); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("member_id=engine: %v, want a refusal", err)
	}
	// The two packages must agree on the name.
	if natssubject.ReservedMemberID != "engine" {
		t.Fatalf("natssubject.ReservedMemberID is %q: config refuses \"engine\"", natssubject.ReservedMemberID)
	}
}
