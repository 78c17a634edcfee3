package e2e

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNatsMicroLsListsConnex runs the real NATS CLI (natscli, installed by
// scripts/test.sh) against a connexd on the embedded default and checks
// that `nats micro ls` and `nats micro info connex` list the service.
func TestNatsMicroLsListsConnex(t *testing.T) {
	natsBin, err := exec.LookPath("nats")
	if err != nil {
		missing(t, "natscli not installed (scripts/test.sh installs it with go install)")
	}
	pn := startConnexd(t, "listed", "--backend", "tcp")
	out, err := exec.Command(natsBin, "-s", pn.natsURL, "--creds", adminCreds(pn.natsURL), "micro", "ls").CombinedOutput()
	if err != nil {
		t.Fatalf("nats micro ls: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "connex") || !strings.Contains(string(out), "member listed") {
		t.Fatalf("nats micro ls does not list connex:\n%s", out)
	}
	out, err = exec.Command(natsBin, "-s", pn.natsURL, "--creds", adminCreds(pn.natsURL), "micro", "info", "connex").CombinedOutput()
	if err != nil {
		t.Fatalf("nats micro info: %v\n%s", err, out)
	}
	for _, subj := range []string{"connex.v1.listed.hold.create", "connex.v1.listed.pull.start", "connex.v1.listed.request.start"} {
		if !strings.Contains(string(out), subj) {
			t.Fatalf("nats micro info connex lacks %s:\n%s", subj, out)
		}
	}
}
