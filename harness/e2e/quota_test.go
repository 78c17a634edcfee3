package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// TestQuotasAnswerOverloaded: a real connexd with small limits refuses,
// with 429 overloaded and the limit's name, a region over
// region_max_bytes, a hold over holds_max_per_engine, a request over
// requests_max, and a request whose state no longer fits the request
// bucket (request_store_bytes); an absurd layout (4 Gi one-byte blocks)
// is a bad layout at once, nothing reserved. What was admitted before
// keeps working.
func TestQuotasAnswerOverloaded(t *testing.T) {
	url := startNATS(t)
	pn := startConnexd(t, "q", "--backend", "tcp", "--nats-url", url, "--holds-max-per-engine", "2", "--requests-max", "2",
		"--region-max-bytes", fmt.Sprint(testLayout.Size()*3/2), "--request-store-bytes", "65536")
	nc := connect(t, url)
	e := newEngine(t, nc, "q", "engQ", testLayout, false)
	pl := &messages.Layout{NumLayers: testLayout.Layers, KvPlanes: testLayout.Planes, NumBlocks: testLayout.Blocks, BlockBytes: testLayout.BlockBytes, BlockSize: testLayout.BlockSize, TpSize: testLayout.TPSize}
	overloaded := func(what string, err error, limit string) {
		t.Helper()
		if api.CodeOf(err) != api.CodeOverloaded || !strings.Contains(err.Error(), limit) {
			t.Fatalf("%s: %v, want 429 overloaded naming %s", what, err, limit)
		}
	}
	_, err := e.cli.CreateRegion(ctx5(t), &messages.CreateRegionRequest{EngineId: "engQ2", RegionId: "r0", Layout: pl})
	overloaded("a second region past region_max_bytes", err, "region_max_bytes")
	absurd := &messages.Layout{NumLayers: 1, KvPlanes: 2, NumBlocks: 4294967295, BlockBytes: 1, BlockSize: 16, TpSize: 1}
	if _, err := e.cli.CreateRegion(ctx5(t), &messages.CreateRegionRequest{EngineId: "engQ3", RegionId: "r0", Layout: absurd}); api.CodeOf(err) != api.CodeBadLayout {
		t.Fatalf("4 Gi one-byte blocks: %v, want bad_layout", err)
	}

	var holds []*messages.KVTransferParams
	for i := range 2 {
		h, err := e.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: e.id, RegionId: e.rid, BlockIds: []uint32{uint32(i)}})
		if err != nil {
			t.Fatal(err)
		}
		holds = append(holds, h.Params)
	}
	_, err = e.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: e.id, RegionId: e.rid, BlockIds: []uint32{5}})
	overloaded("a third hold", err, "holds_max_per_engine")

	start := func(id string, prompt []uint32) error {
		_, err := e.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: id, Params: holds[0], PromptTokenIds: prompt, EngineId: e.id})
		return err
	}
	if err := start("r1", []uint32{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	// A state of ~90 KiB does not fit a 64 KiB bucket.
	big := make([]uint32, 30000)
	for i := range big {
		big[i] = 1 << 20
	}
	overloaded("a request whose state overflows the bucket", start("r-big", big), "store is full")
	if err := start("r2", []uint32{4}); err != nil {
		t.Fatal(err)
	}
	overloaded("a third request in flight", start("r3", []uint32{5}), "requests_max")
	// What was admitted still works.
	if _, err := e.cli.FinishRequest(ctx5(t), &messages.FinishRequestMsg{RequestId: "r1", Epoch: 1}); err != nil {
		t.Fatalf("finish r1: %v", err)
	}
	if err := start("r3", []uint32{5}); err != nil {
		t.Fatalf("a request once there is room again: %v", err)
	}
	if !pn.running() {
		t.Fatal("connexd died")
	}
}
