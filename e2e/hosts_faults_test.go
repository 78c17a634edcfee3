package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// pullOn has member on's engine pull params into dst and waits for the
// pull's notice (total bounds the wait).
func (c *hostPD) pullOn(t *testing.T, on, id string, prm *messages.KVTransferParams, dst []uint32, total time.Duration) *messages.PullDone {
	t.Helper()
	e := c.engines[on]
	done := subscribe(t, c.ncs[on], api.PullDoneSubject(e.id), func() *messages.PullDone { return new(messages.PullDone) })
	if _, err := e.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: prm, EngineId: e.id, RegionId: e.rid, BlockIds: dst, PullId: id}); err != nil {
		t.Fatalf("start pull %s on %s: %v", id, on, err)
	}
	return done.wait(t, total, func(m *messages.PullDone) bool { return m.PullId == id })
}

// TestHostsPullAcrossHosts: members on three hosts against a three-node NATS
// cluster; a decode host pulls a hold from the prefill host over the TCP
// data plane, between two addresses of the lab, and the request bucket has
// three replicas.
func TestHostsPullAcrossHosts(t *testing.T) {
	c := newHostPD(t, 3)
	prm := c.hold(t, []uint32{1, 2, 3}, 48)
	h1 := c.lab.Hosts[0]
	if !strings.HasPrefix(c.prefill.dataAddr, h1.IP+":") {
		t.Fatalf("the prefill member's data address %q is not on its host %s", c.prefill.dataAddr, h1.IP)
	}
	for _, d := range []string{"d2", "d3"} {
		start := time.Now()
		n := c.pullOn(t, d, "x-"+d, prm, []uint32{5, 6, 7}, 10*time.Second)
		if !n.Ok {
			t.Fatalf("pull on %s: %v", d, n)
		}
		t.Logf("%s pulled %d bytes from h1 in %s", d, n.Bytes, time.Since(start).Round(time.Millisecond))
		verifyBlocks(t, c.engP.region, c.engines[d].region, []uint32{1, 2, 3}, []uint32{5, 6, 7}, nil)
	}
	info, err := bucketInfo(ctx5(t), c.ncs["d2"])
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("request bucket: replicas %d, cluster %+v", info.Config.Replicas, info.Cluster)
	}
}
