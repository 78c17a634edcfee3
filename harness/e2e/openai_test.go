package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
	"github.com/connex/connex/harness/poll"
)

// TestOpenAIClient runs the official OpenAI Python client, unmodified
// (harness/e2e/openai/test_openai_client.py, pinned in
// harness/e2e/openai/requirements.txt), against the router of a local cluster
// of real processes: models, completions and chat, streamed and not, and an
// unknown model.
func TestOpenAIClient(t *testing.T) {
	python := os.Getenv("CONNEX_PYTHON")
	if python == "" {
		missing(t, "CONNEX_PYTHON is unset: `make test` sets it (scripts/test.sh builds .venv-test/ from "+
			"harness/e2e/openai/requirements.txt); by hand: python3 -m venv .venv-test && "+
			".venv-test/bin/pip install -r harness/e2e/openai/requirements.txt && "+
			"CONNEX_PYTHON=$PWD/.venv-test/bin/python go test ./harness/e2e -run OpenAI")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	sim := filepath.Join(t.TempDir(), "connex-sim")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", sim, "../../cmd/connex-sim").CombinedOutput(); err != nil {
		t.Fatalf("build connex-sim: %v\n%s", err, out)
	}

	var logs syncBuffer
	o := localcluster.Defaults()
	o.Connexd, o.Sim = connexdBin, sim
	o.PrefillPerToken, o.DecodePerToken = 10*time.Microsecond, 2*time.Millisecond
	o.Log = &logs
	c, err := localcluster.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("cluster output:\n%s", logs.String())
		}
	}()

	cmd := exec.CommandContext(ctx, python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_openai_client.py")
	cmd.Dir = "openai"
	cmd.Env = append(os.Environ(),
		"CONNEX_ROUTER_URL="+c.RouterURL(),
		"CONNEX_MODEL="+o.Model,
		"PYTHONDONTWRITEBYTECODE=1",
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost",
	)
	out, err := cmd.CombinedOutput()
	t.Logf("pytest:\n%s", out)
	if err != nil {
		t.Fatalf("the OpenAI client tests failed: %v", err)
	}
	if !strings.Contains(string(out), " passed") || strings.Contains(string(out), " skipped") {
		t.Fatal("pytest ran no test or skipped some")
	}
}

// syncBuffer is the cluster's log sink (poll.Buffer).
type syncBuffer = poll.Buffer
