package daemon

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadMemberCreds(t *testing.T) {
	dir := t.TempDir()
	const body = "-----BEGIN NATS USER JWT-----\nx\n------END NATS USER JWT------\n"
	write := func(name string, mode os.FileMode) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		mode   os.FileMode
		refuse string // "" = read
		warn   bool
	}{
		{0o600, "", false},
		{0o400, "", false},
		{0o640, "", true},
		{0o440, "", true},
		{0o644, "mode 0644", false},
		{0o604, "mode 0604", false},
		{0o620, "mode 0620", false},
		{0o602, "mode 0602", false},
	} {
		p := write("m.creds", tc.mode)
		var logs bytes.Buffer
		b, err := readMemberCreds(p, slog.New(slog.NewTextHandler(&logs, nil)))
		switch {
		case tc.refuse == "" && (err != nil || string(b) != body):
			t.Errorf("mode %04o: %v; want it read", tc.mode, err)
		case tc.refuse != "" && (err == nil || !strings.Contains(err.Error(), tc.refuse) || !strings.Contains(err.Error(), "chmod 600")):
			t.Errorf("mode %04o: %v; want refused naming %q and the fix", tc.mode, err, tc.refuse)
		}
		if warned := strings.Contains(logs.String(), "readable by its group"); warned != tc.warn {
			t.Errorf("mode %04o: warned %v, want %v (log %q)", tc.mode, warned, tc.warn, logs.String())
		}
	}
	if os.Geteuid() == 0 {
		p := write("other.creds", 0o600)
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := readMemberCreds(p, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
			t.Errorf("a file owned by another uid: %v; want refused", err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := readMemberCreds(filepath.Join(dir, "d"), slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
}
