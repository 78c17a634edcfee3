package e2e

import (
	"bufio"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/encoding/protojson"
)

// TestStatusCLIShowsTheCluster: `connexd status`, run as an operator would
// against a live cluster of connexd processes, lists the members, the
// hold a request depends on (with its engine and age) and the request
// (owner, engine, epoch, not resumed); --json gives the same as one protojson line per
// member.
func TestStatusCLIShowsTheCluster(t *testing.T) {
	c := newDecodeCluster(t, "d1", "d2")
	prm := c.hold(t, []uint32{1, 2, 3}, 48)
	c.startRequest(t, "d1", "r-status", prm, prompt(48))
	run := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, connexdBin, append([]string{"status", "--nats-url", c.url}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("connexd status %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	out := run()
	t.Logf("connexd status:\n%s", out)
	for _, want := range []string{"MEMBER", "prefill", "d1", "d2", prm.TransferId, c.prefill.id, "r-status", "eng-d1"} {
		if !strings.Contains(out, want) {
			t.Fatalf("connexd status does not show %q:\n%s", want, out)
		}
	}
	// The hold's row names its member and engine; the request's its owner
	// and epoch.
	var holdRow, reqRow string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prm.TransferId) {
			holdRow = l
		}
		if strings.HasPrefix(l, "r-status") {
			reqRow = l
		}
	}
	if f := strings.Fields(holdRow); len(f) < 4 || f[1] != "prefill" || f[2] != c.prefill.id || f[3] != "held" {
		t.Fatalf("hold row %q", holdRow)
	}
	if f := strings.Fields(reqRow); len(f) < 4 || f[1] != "d1" || f[2] != "eng-d1" || f[3] != "1" {
		t.Fatalf("request row %q", reqRow)
	}
	// Never resumed (epoch 1): RESUMED_BY and FROM say so, whoever would
	// resume it (clusterstatus/render_test.go covers resumed rows).
	if f := strings.Fields(reqRow); len(f) < 10 || f[8] != "-" || f[9] != "-" {
		t.Fatalf("request row %q: RESUMED_BY and FROM of a request never resumed must be -", reqRow)
	}

	members := map[string]*messages.MemberStatus{}
	sc := bufio.NewScanner(strings.NewReader(run("--json")))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := new(messages.MemberStatus)
		if err := protojson.Unmarshal(sc.Bytes(), m); err != nil {
			t.Fatalf("--json line %q: %v", sc.Text(), err)
		}
		members[m.MemberId] = m
	}
	if len(members) != 3 || len(members["prefill"].GetHolds()) != 1 || len(members["d1"].GetRequests()) != 1 ||
		members["d1"].GetRequests()[0].GetParams().GetTransferId() != prm.TransferId || len(members["d2"].GetClusterMembers()) != 3 {
		t.Fatalf("--json: %v", members)
	}
}
