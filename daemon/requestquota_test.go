package daemon

import (
	"context"
	"testing"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
)

// TestRequestQuotaRefusesOnlyTheEngineOverIt: an engine past its live
// requests or its stored bytes gets 429 for its own request.start and
// request.progress, while another engine on the same member starts and
// progresses; a finished request gives its room back.
func TestRequestQuotaRefusesOnlyTheEngineOverIt(t *testing.T) {
	a, _, _ := newTestRequestAPI()
	a.max = 100
	a.quota = &requests.Quota{MaxRequests: 3, MaxBytes: 64 << 10, MaxMemberBytes: 1 << 20}
	ctx := context.Background()
	prompt := make([]uint32, 4096) // 16 KiB as counted
	start := func(id, engine string) error {
		_, err := a.StartRequest(ctx, &messages.StartRequestMsg{RequestId: id, EngineId: engine, Params: heldBy("p1"), PromptTokenIds: prompt})
		return err
	}
	for _, id := range []string{"a1", "a2", "a3"} {
		if err := start(id, "d1"); err != nil {
			t.Fatalf("d1's %s: %v", id, err)
		}
	}
	wantCode(t, "d1's fourth request", start("a4", "d1"), api.CodeOverloaded)
	if err := start("b1", "d2"); err != nil {
		t.Fatalf("d2 while d1 is at its quota: %v", err)
	}
	// d1's bytes: 3 × 16 KiB stored, 16 KiB left.
	_, err := a.Progress(ctx, &messages.RequestProgress{RequestId: "a1", Epoch: 1, TokenIds: make([]uint32, 4097)})
	wantCode(t, "d1 growing past its bytes", err, api.CodeOverloaded)
	if _, err := a.Progress(ctx, &messages.RequestProgress{RequestId: "b1", Epoch: 1, TokenIds: make([]uint32, 4097)}); err != nil {
		t.Fatalf("d2 growing while d1 is at its bytes: %v", err)
	}
	_, err = a.Progress(ctx, &messages.RequestProgress{RequestId: "a1", Epoch: 1, TokenIds: make([]uint32, requests.MaxGenerated+1)})
	wantCode(t, "one progress call past the generated-token bound", err, api.CodeBadRequest)
	if _, err := a.FinishRequest(ctx, &messages.FinishRequestMsg{RequestId: "a1", Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	if err := start("a4", "d1"); err != nil {
		t.Fatalf("d1 after finishing a request: %v", err)
	}
}

// TestStartOfAnotherEnginesRunningRequestMovesNoQuota: a request id is a
// name anyone may send. An engine that sends request.start (no takeover)
// with the id of another engine's request running here is refused as
// existing, and the quota still counts the request for its own engine:
// the sender cannot make the owner's checkpoints count against its own
// (full) quota.
func TestStartOfAnotherEnginesRunningRequestMovesNoQuota(t *testing.T) {
	a, acts, _ := newTestRequestAPI()
	a.max = 100
	a.quota = &requests.Quota{MaxRequests: 3, MaxBytes: 64 << 10, MaxMemberBytes: 1 << 20}
	ctx := context.Background()
	if _, err := a.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "b1", EngineId: "d2", Params: heldBy("p1"), PromptTokenIds: make([]uint32, 16)}); err != nil {
		t.Fatal(err)
	}
	if _, ok := acts.lookup("b1"); !ok {
		t.Fatal("b1 does not run")
	}
	_, err := a.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "b1", EngineId: "d1", Params: heldBy("p1")})
	wantCode(t, "d1's start of d2's running request", err, api.CodeRequestExists)
	if u := a.quota.Engine("d2"); u.Requests != 1 {
		t.Fatalf("d2's quota counts %d requests after d1's start of its request, want 1", u.Requests)
	}
	if u := a.quota.Engine("d1"); u.Requests != 0 {
		t.Fatalf("d1's quota counts %d requests, want 0", u.Requests)
	}
}
