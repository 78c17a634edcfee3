package daemon

import (
	"context"
	"slices"
	"testing"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// fakeReserver records reserve and unreserve.
type fakeReserver struct{ calls []string }

func (f *fakeReserver) reserve(engine, request string, p *messages.KVTransferParams) {
	f.calls = append(f.calls, "reserve "+engine+" "+request+" "+p.GetTransferId())
}

func (f *fakeReserver) unreserve(request string) { f.calls = append(f.calls, "unreserve "+request) }

// TestRequestsReserveTheirPulls: a request that request.start started
// here (or took over) reserves its pull's read of the hold; one that was
// refused reserves nothing; request.finish drops the reservation before
// the request's actor releases the hold.
func TestRequestsReserveTheirPulls(t *testing.T) {
	a, acts, _ := newTestRequestAPI("r1")
	rs := &fakeReserver{}
	a.reservations = rs
	ctx := context.Background()
	if _, err := a.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "r2", EngineId: "d1", Params: heldBy("p1")}); err != nil {
		t.Fatal(err)
	}
	_, err := a.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "r3", EngineId: "d1", Params: heldBy("p1")})
	wantCode(t, "request.start over requests_max", err, api.CodeOverloaded)
	if _, err := a.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "r1", EngineId: "d1", Takeover: true, Params: heldBy("p1")}); err != nil {
		t.Fatal(err)
	}
	acts.askErr = api.Errorf(api.CodeUnknownRequest, "gone")
	_, _ = a.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "r1", EngineId: "d1", Takeover: true, Params: heldBy("p1")})
	acts.askErr = nil
	if _, err := a.FinishRequest(ctx, &messages.FinishRequestMsg{RequestId: "r2", Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	tid := heldBy("p1").TransferId
	want := []string{"reserve d1 r2 " + tid, "reserve d1 r1 " + tid, "unreserve r2"}
	if !slices.Equal(rs.calls, want) {
		t.Fatalf("reservations %q, want %q", rs.calls, want)
	}
}
