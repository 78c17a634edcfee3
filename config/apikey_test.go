package config

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestRouterKeysAndLimits: api keys come from a comma-separated value (flag
// or CONNEX_API_KEY) and a file of one per line; admin keys likewise; a
// key file that cannot be read or holds no key fails the start; the HTTP
// limits have their documented defaults.
func TestRouterKeysAndLimits(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "keys")
	if err := os.WriteFile(file, []byte("# clients\nkey-from-file-1\n\n  key-from-file-2  \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load([]string{"--api-key-file", file, "--admin-api-key", "adm-1, adm-2"}, []string{"CONNEX_API_KEY=env-1,env-2"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"env-1", "env-2", "key-from-file-1", "key-from-file-2"}; !slices.Equal(c.APIKeys, want) {
		t.Fatalf("api keys %q, want %q", c.APIKeys, want)
	}
	if want := []string{"adm-1", "adm-2"}; !slices.Equal(c.AdminKeys, want) {
		t.Fatalf("admin keys %q, want %q", c.AdminKeys, want)
	}
	empty := filepath.Join(dir, "empty")
	_ = os.WriteFile(empty, []byte("# nothing\n"), 0o600)
	for _, args := range [][]string{{"--api-key-file", filepath.Join(dir, "missing")}, {"--admin-api-key-file", empty}} {
		if _, err := Load(args, nil); err == nil {
			t.Errorf("%v: loaded", args)
		}
	}
	d, err := Load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.APIKeys)+len(d.AdminKeys) != 0 || d.RouterReadHeaderTimeout != 10*time.Second || d.RouterReadTimeout != time.Minute ||
		d.RouterIdleTimeout != 2*time.Minute || d.RouterMaxConns != 4096 || d.RouterMaxInFlight != 256 || d.RouterGOGC != 400 {
		t.Fatalf("defaults: %+v", d)
	}
}
