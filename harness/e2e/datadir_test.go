package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSecondConnexdOnADataDirRefuses: two connexd processes embedding NATS
// on one data_dir — the second exits at once with a message naming the
// lock file, and the first keeps serving.
func TestSecondConnexdOnADataDirRefuses(t *testing.T) {
	dir := t.TempDir()
	first := startProc(t, "connexd", connexdBin, "one", []string{"--member-id", "one", "--data-dir", dir, "--nats-listen", "127.0.0.1:0", "--backend", "tcp"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, connexdBin, "--member-id", "two", "--data-dir", dir, "--nats-listen", "127.0.0.1:0", "--backend", "tcp").CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("the second connexd on %s: err %v (ctx %v), want a refusal at start:\n%s", dir, err, ctx.Err(), out)
	}
	if lock := filepath.Join(dir, "connexd.lock"); !strings.Contains(string(out), lock) {
		t.Fatalf("the refusal does not name the lock %s:\n%s", lock, out)
	}
	if !first.running() {
		t.Fatalf("the first connexd stopped:\n%s", first.logs())
	}
}
