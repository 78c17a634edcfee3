package localcluster

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestLocalFakeClientEnv: the env file, sourced by a real shell, sets the
// cluster's NATS URL and admin credentials for connexd status and the nats
// CLI, the router's URL and the admin key file.
func TestLocalFakeClientEnv(t *testing.T) {
	needProc(t)
	c, err := Start(context.Background(), fakeOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	path := filepath.Join(t.TempDir(), "it's.env") // a quote in the path, for the header
	if err := c.WriteClientEnv(path); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("sh", "-c", `. "$0" && env`, path).Output()
	if err != nil {
		t.Fatalf("sh: . %s: %v", path, err)
	}
	got := map[string]string{}
	for _, kv := range strings.Split(string(out), "\n") {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}
	want := map[string]string{
		"CONNEX_NATS_URL": c.NATSURL(), "NATS_URL": c.NATSURL(), "CONNEX_ROUTER_URL": c.RouterURL(),
		"CONNEX_ADMIN_KEY_FILE": c.AdminKeyFile(),
	}
	for k, v := range want {
		if got[k] != v || v == "" {
			t.Errorf("after sourcing: %s=%q, want %q", k, got[k], v)
		}
	}
	// The fake router has no authority: no credentials to name.
	if _, ok := got["CONNEX_NATS_CREDS"]; ok || c.AdminCreds() != "" {
		t.Errorf("CONNEX_NATS_CREDS=%q with AdminCreds %q", got["CONNEX_NATS_CREDS"], c.AdminCreds())
	}
	if env := c.ClientEnv(); len(env) != 4 || !strings.HasPrefix(env[0], "CONNEX_NATS_URL=") {
		t.Errorf("ClientEnv %q", env)
	}
}

// TestChildEnvDropsTheClientEnv: a shell that sourced an env file does not
// hand it to the cluster's processes; other CONNEX_* settings pass.
func TestChildEnvDropsTheClientEnv(t *testing.T) {
	for _, k := range clientEnvKeys {
		t.Setenv(k, "stale")
	}
	t.Setenv("CONNEX_LOG_LEVEL", "debug")
	env := childEnv()
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); slices.Contains(clientEnvKeys, k) {
			t.Errorf("childEnv keeps %s", kv)
		}
	}
	if !slices.Contains(env, "CONNEX_LOG_LEVEL=debug") {
		t.Error("childEnv dropped CONNEX_LOG_LEVEL")
	}
}
