package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestAPIKeyFile: --api-key-file sets the key the router requires (its
// first line); by default there is none, and an empty or missing file is
// an error.
func TestAPIKeyFile(t *testing.T) {
	dir := t.TempDir()
	good, empty := filepath.Join(dir, "key"), filepath.Join(dir, "empty")
	_ = os.WriteFile(good, []byte("  sk-local-1  \nignored\n"), 0o600)
	_ = os.WriteFile(empty, []byte("\n"), 0o600)
	if f, err := parseFlags(nil, io.Discard); err != nil || f.opts.APIKey != "" {
		t.Fatalf("default: key %q, %v", f.opts.APIKey, err)
	}
	if f, err := parseFlags([]string{"--api-key-file", good}, io.Discard); err != nil || f.opts.APIKey != "sk-local-1" {
		t.Fatalf("key %q, %v", f.opts.APIKey, err)
	}
	for _, f := range []string{empty, filepath.Join(dir, "missing")} {
		if _, err := parseFlags([]string{"--api-key-file", f}, io.Discard); err == nil {
			t.Errorf("--api-key-file %s: no error", f)
		}
	}
}
