package e2e

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// TestConnexdMetrics: with metrics_listen set, connexd serves Prometheus
// metrics that follow its holds and pulls.
func TestConnexdMetrics(t *testing.T) {
	pe, de, pn, dn := cluster2(t, "tcp", "--metrics-listen", "127.0.0.1:0")
	if pn.metricsURL == "" || dn.metricsURL == "" {
		t.Fatal("the ready line names no metrics= URL")
	}
	nc := pe.cli.NC
	done := subscribe(t, nc, api.PullDoneSubject(de.cli.Member, de.id), func() *messages.PullDone { return new(messages.PullDone) })
	src := []uint32{1, 2, 3}
	hold, err := pe.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pe.id, RegionId: pe.rid, BlockIds: src, NumTokens: 48})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: hold.Params, EngineId: de.id, RegionId: de.rid, BlockIds: []uint32{4, 5, 6}, PullId: "m1"}); err != nil {
		t.Fatal(err)
	}
	pd := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == "m1" })
	if !pd.Ok {
		t.Fatalf("pull: %v", pd)
	}
	dm, err := scrape(dn.metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	if dm[`connex_pulls_total{outcome="ok"}`] != 1 || dm["connex_pull_bytes_total"] != float64(pd.Bytes) || dm[`connex_pull_duration_seconds_count{backend="tcp"}`] != 1 ||
		dm[`connex_pull_read_seconds_count{backend="tcp"}`] != 1 || dm[`connex_pull_size_bytes_sum{backend="tcp"}`] != float64(pd.Bytes) || pd.ReadUs == 0 || pd.ReadUs > pd.DurationUs {
		t.Fatalf("decode metrics after one pull of %d bytes: pulls %v bytes %v durations %v", pd.Bytes,
			dm[`connex_pulls_total{outcome="ok"}`], dm["connex_pull_bytes_total"], dm[`connex_pull_duration_seconds_count{backend="tcp"}`])
	}
	pm, err := scrape(pn.metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	if pm["connex_holds_created_total"] != 1 || pm["connex_holds_live"] != 1 || pm[`connex_holds{state="held"}`] != 1 {
		t.Fatalf("prefill metrics with one live hold: created %v live %v", pm["connex_holds_created_total"], pm["connex_holds_live"])
	}
	// Per engine: three blocks of four layers and two planes of 4 KiB.
	blockBytes := float64(testLayout.Layers) * float64(testLayout.Planes) * float64(testLayout.BlockBytes)
	if pm[`connex_held_blocks{engine="engP"}`] != 3 || pm[`connex_held_bytes{engine="engP"}`] != 3*blockBytes || pm["connex_hold_oldest_age_seconds"] <= 0 {
		t.Fatalf("prefill metrics per engine: blocks %v bytes %v oldest %v", pm[`connex_held_blocks{engine="engP"}`], pm[`connex_held_bytes{engine="engP"}`], pm["connex_hold_oldest_age_seconds"])
	}
	// The data plane's own counts: the holder served the pull's requests
	// (GETs, or GATHERs where the reader already knew the holder speaks
	// protocol version 2), and nobody fell back to version 1.
	if served := pm["connex_data_plane_tcp_gets_served_total"] + pm["connex_data_plane_tcp_gathers_served_total"]; served < 1 ||
		dm["connex_data_plane_tcp_gets_served_total"] != 0 || dm["connex_data_plane_tcp_protocol_fallbacks_total"] != 0 {
		t.Fatalf("data plane counters: holder served %v GETs and %v GATHERs, reader served %v, fallbacks %v", pm["connex_data_plane_tcp_gets_served_total"],
			pm["connex_data_plane_tcp_gathers_served_total"], dm["connex_data_plane_tcp_gets_served_total"], dm["connex_data_plane_tcp_protocol_fallbacks_total"])
	}
	if _, ok := dm["connex_data_plane_tcp_protocol_fallbacks_total"]; !ok {
		t.Fatal("the reader exports no connex_data_plane_tcp_protocol_fallbacks_total")
	}
	if dm[`connex_notices_total{kind="pull.done"}`] != 1 || dm["connex_pulls_in_flight"] != 0 {
		t.Fatalf("decode notices %v, pulls in flight %v", dm[`connex_notices_total{kind="pull.done"}`], dm["connex_pulls_in_flight"])
	}
	if _, err := de.cli.Renew(ctx5(t), &messages.HoldRef{TransferId: hold.Params.TransferId, Requester: de.id}); err == nil {
		t.Fatal("renew on the decode member, which does not hold it: want an error")
	}
	if _, err := pe.cli.Renew(ctx5(t), &messages.HoldRef{TransferId: hold.Params.TransferId, Requester: de.id}); err != nil {
		t.Fatal(err)
	}
	if pm, err = scrape(pn.metricsURL); err != nil || pm["connex_lease_renewals_total"] != 1 {
		t.Fatalf("lease renewals after one renew: %v %v", pm["connex_lease_renewals_total"], err)
	}
	if _, err := pe.cli.Release(ctx5(t), &messages.HoldRef{TransferId: hold.Params.TransferId, Requester: de.id}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		pm, err := scrape(pn.metricsURL)
		if err != nil || pm[`connex_holds_freed_total{reason="released"}`] != 1 || pm["connex_holds_live"] != 0 || pm["connex_double_frees_total"] != 0 ||
			pm[`connex_held_blocks{engine="engP"}`] != 0 || pm["connex_hold_oldest_age_seconds"] != 0 || pm[`connex_notices_total{kind="blocks.freed"}`] != 1 {
			return fmt.Errorf("prefill metrics after the release: %v", err)
		}
		return nil
	})
}

// TestDashboardUsesDocumentedMetrics: every series the Grafana dashboard
// queries is in docs/operating.md's metrics table, so the two cannot drift apart.
func TestDashboardUsesDocumentedMetrics(t *testing.T) {
	dash, err := os.ReadFile("../../deploy/grafana/connex.json")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`connex_[a-z0-9_]+`).FindAllString(string(dash), -1)
	if len(names) < 10 {
		t.Fatalf("the dashboard queries only %d series", len(names))
	}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
		if !strings.Contains(string(readme), "`"+base+"`") {
			t.Errorf("the dashboard queries %s, which docs/operating.md's metrics table does not document", base)
		}
	}
}
