package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/connex/connex/api"
	"github.com/connex/connex/harness/poll"
	"github.com/connex/connex/messages"
)

// TestQuotasAnswerOverloaded: a real connexd with small limits refuses,
// with 429 overloaded and the limit's name, a region over
// region_max_bytes, a hold over holds_max_per_engine, a request over
// requests_max, and a request whose state no longer fits the request
// bucket (request_store_bytes); an absurd layout (4 Gi one-byte blocks)
// is a bad layout at once, nothing reserved (the member's share of the
// bucket, half of it, refuses the request first). What was admitted before
// keeps working.
func TestQuotasAnswerOverloaded(t *testing.T) {
	url := startNATS(t)
	pn := startConnexd(t, "q", "--backend", "tcp", "--nats-url", url, "--holds-max-per-engine", "2", "--requests-max", "2",
		"--region-max-bytes", fmt.Sprint(testLayout.Size()*3/2), "--request-store-bytes", "65536",
		// The engine's own bound (an eighth of the bucket by default) out of
		// the way: this request is refused by the member's share of the bucket.
		"--request-bytes-per-engine", "1048576")
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
	// A state of ~90 KiB does not fit a 64 KiB bucket, nor this member's
	// half of it.
	big := make([]uint32, 30000)
	for i := range big {
		big[i] = 1 << 20
	}
	overloaded("a request whose state overflows the bucket", start("r-big", big), "request_store_bytes")
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

// TestEngineQuotaSparesOtherEngines is issue 44's finding 2 against real
// connexd processes: an engine past its own quotas (requests_max_per_engine,
// request_bytes_per_engine) gets 429 overloaded naming the limit, while
// another engine on the same member and an engine on another member start
// their requests; the engine gets room back when one of its requests ends.
// Before the fix one engine filled the member's requests_max and the
// cluster's one request bucket for everyone.
func TestEngineQuotaSparesOtherEngines(t *testing.T) {
	url := startNATS(t)
	pn := startConnexd(t, "q", "--backend", "tcp", "--nats-url", url, "--requests-max-per-engine", "2",
		"--request-bytes-per-engine", "65536")
	startConnexd(t, "q2", "--backend", "tcp", "--nats-url", url)
	nc := connect(t, url)
	a := newEngine(t, nc, "q", "engA", testLayout, false)
	b := newEngine(t, nc, "q", "engB", testLayout, false)
	c := newEngine(t, nc, "q2", "engC", testLayout, false)
	start := func(e *engine, id string, prompt []uint32) error {
		h, err := e.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: e.id, RegionId: e.rid, BlockIds: []uint32{uint32(len(id) % 8)}})
		if err != nil {
			return err
		}
		_, err = e.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: id, Params: h.Params, PromptTokenIds: prompt, EngineId: e.id})
		return err
	}
	overloaded := func(what string, err error, limit string) {
		t.Helper()
		if api.CodeOf(err) != api.CodeOverloaded || !strings.Contains(err.Error(), limit) {
			t.Fatalf("%s: %v, want 429 overloaded naming %s", what, err, limit)
		}
	}
	for _, id := range []string{"a1", "a2"} {
		if err := start(a, id, []uint32{1, 2, 3}); err != nil {
			t.Fatalf("engA %s: %v", id, err)
		}
	}
	overloaded("engA's third live request", start(a, "a3", []uint32{4}), "requests_max_per_engine")
	if err := start(b, "b1", []uint32{1, 2, 3}); err != nil {
		t.Fatalf("engB on the same member, engA at its quota: %v", err)
	}
	if err := start(c, "c1", []uint32{1, 2, 3}); err != nil {
		t.Fatalf("engC on another member, engA at its quota: %v", err)
	}
	// ~80 KiB of prompt is over engB's 64 KiB of stored requests.
	big := make([]uint32, 20000)
	overloaded("engB's request past its stored bytes", start(b, "b-big", big), "request_bytes_per_engine")
	if err := start(c, "c-big", big); err != nil {
		t.Fatalf("the same prompt from engC on another member: %v", err)
	}
	if err := start(b, "b2", []uint32{4}); err != nil {
		t.Fatalf("a small request of engB after its big one was refused: %v", err)
	}
	if _, err := a.cli.FinishRequest(ctx5(t), &messages.FinishRequestMsg{RequestId: "a1", Epoch: 1}); err != nil {
		t.Fatalf("finish a1: %v", err)
	}
	if err := start(a, "a3", []uint32{4}); err != nil {
		t.Fatalf("engA once one of its requests ended: %v", err)
	}
	if !pn.running() {
		t.Fatal("connexd died")
	}
}

// TestStartWithoutHoldKeepsNoRecord (issue 44): against real NATS and
// connexd processes, an engine's request.start whose transfer id names no
// hold is answered (the start does not wait on the holder), but its first
// renewal finds the hold gone: the engine gets hold.lost, the record leaves
// the request store, and the request no longer counts against the engine's
// quota. Before the fix such records stayed until their engine went, and
// one engine filled the cluster's request bucket with them.
func TestStartWithoutHoldKeepsNoRecord(t *testing.T) {
	url := startNATS(t)
	pn := startConnexd(t, "nh", "--backend", "tcp", "--nats-url", url, "--requests-max-per-engine", "1")
	nc := connect(t, url)
	e := newEngine(t, nc, "nh", "engN", testLayout, false)
	h, err := e.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: e.id, RegionId: e.rid, BlockIds: []uint32{1}})
	if err != nil {
		t.Fatal(err)
	}
	forged := proto.Clone(h.Params).(*messages.KVTransferParams)
	forged.TransferId = "0123456789abcdef0123456789abcdef" // well-formed, naming no hold
	malformed := proto.Clone(forged).(*messages.KVTransferParams)
	malformed.TransferId = "no-such-transfer"
	if _, err := e.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "nh0", Params: malformed, PromptTokenIds: []uint32{1}, EngineId: e.id}); api.CodeOf(err) != api.CodeBadRequest {
		t.Fatalf("request.start with a malformed transfer id: %v, want bad_request", err)
	}
	if _, err := e.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "nh1", Params: forged, PromptTokenIds: []uint32{1, 2, 3}, EngineId: e.id}); err != nil {
		t.Fatalf("request.start naming no hold: %v (the start answers before its first renewal)", err)
	}
	poll.Until(t, 10*time.Second, 20*time.Millisecond, func() error {
		_, err := e.cli.InspectRequest(ctx5(t), &messages.RequestRef{RequestId: "nh1"})
		if api.CodeOf(err) != api.CodeUnknownRequest {
			return fmt.Errorf("request nh1 after its first renewal: %v, want unknown_request", err)
		}
		return nil
	})
	// Its quota slot is back: a real request of the same engine starts.
	if _, err := e.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "nh2", Params: h.Params, PromptTokenIds: []uint32{1, 2, 3}, EngineId: e.id}); err != nil {
		t.Fatalf("a request with a live hold after the one without: %v", err)
	}
	if !pn.running() {
		t.Fatal("connexd died")
	}
}
