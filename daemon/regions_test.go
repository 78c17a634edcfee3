package daemon

import (
	"context"
	"errors"
	"testing"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
)

func newTestRegionAPI() (*regionAPI, *fakeRegions, *fakeAlloc) {
	tb, al := newFakeRegions(), &fakeAlloc{}
	return &regionAPI{table: tb, alloc: al, log: quiet}, tb, al
}

func TestRegionCallsRefuseBadRequests(t *testing.T) {
	a, tb, al := newTestRegionAPI()
	ctx := context.Background()
	lp := actors.LayoutToProto(testLayout())
	_, err := a.InspectRegion(ctx, &messages.RegionRef{EngineId: "e.1", RegionId: "r"})
	wantCode(t, "inspect with an engine id that is no subject token", err, api.CodeBadRequest)
	_, err = a.CreateRegion(ctx, &messages.CreateRegionRequest{EngineId: "e", RegionId: "r>", Layout: lp})
	wantCode(t, "create with a region id that is no subject token", err, api.CodeBadRequest)
	bad := testLayout()
	bad.Planes = 3
	_, err = a.CreateRegion(ctx, &messages.CreateRegionRequest{EngineId: "e", RegionId: "r", Layout: actors.LayoutToProto(bad)})
	wantCode(t, "create with a bad layout", err, api.CodeBadLayout)
	_, err = a.RegisterRegion(ctx, &messages.RegisterRegionRequest{EngineId: "e", RegionId: "r", Layout: lp})
	wantCode(t, "register without a path", err, api.CodeBadRequest)
	_, err = a.InspectRegion(ctx, &messages.RegionRef{EngineId: "e", RegionId: "nope"})
	wantCode(t, "inspect of an unknown region", err, api.CodeUnknownRegion)
	tb.regErr = kvmem.ErrRegionExists
	_, err = a.RegisterRegion(ctx, &messages.RegisterRegionRequest{EngineId: "e", RegionId: "r", Path: "/x", Layout: lp})
	wantCode(t, "register over a region registered differently", err, api.CodeBadRequest)
	if al.made != 0 {
		t.Fatalf("refused calls allocated %d regions", al.made)
	}
}

func TestCreateRegionAgainAnswersTheSameRegion(t *testing.T) {
	a, tb, al := newTestRegionAPI()
	ctx := context.Background()
	req := func(l kvmem.Layout) *messages.CreateRegionRequest {
		return &messages.CreateRegionRequest{EngineId: "e", RegionId: "r", Layout: actors.LayoutToProto(l)}
	}
	first, err := a.CreateRegion(ctx, req(testLayout()))
	if err != nil {
		t.Fatal(err)
	}
	again, err := a.CreateRegion(ctx, req(testLayout()))
	if err != nil {
		t.Fatal(err)
	}
	if again.Path != first.Path || al.made != 1 {
		t.Fatalf("create again: path %q (first %q), %d allocations; want the same region, one allocation", again.Path, first.Path, al.made)
	}
	other := testLayout()
	other.Blocks = 4
	_, err = a.CreateRegion(ctx, req(other))
	wantCode(t, "create again with another layout", err, api.CodeBadRequest)
	// A registered (engine's own) file of the same layout is not a created region.
	tb.put(t, "e", "file", testLayout(), kvmem.MemoryFile)
	_, err = a.CreateRegion(ctx, &messages.CreateRegionRequest{EngineId: "e", RegionId: "file", Layout: actors.LayoutToProto(testLayout())})
	wantCode(t, "create over a registered file", err, api.CodeBadRequest)
	// Over quota: the table's refusal, and nothing allocated.
	tb.admitErr = kvmem.ErrOverQuota
	_, err = a.CreateRegion(ctx, &messages.CreateRegionRequest{EngineId: "e", RegionId: "r2", Layout: actors.LayoutToProto(testLayout())})
	if !errors.Is(err, kvmem.ErrOverQuota) || al.made != 1 {
		t.Fatalf("create over quota: err %v, %d allocations; want the quota error and no allocation", err, al.made)
	}
}

// fakeGrants is handoverGrants.
type fakeGrants struct{ granted []string }

func (g *fakeGrants) Grant(engine, region string, _ any) (string, error) {
	g.granted = append(g.granted, engine+"/"+region)
	return "tok-" + region, nil
}
func (g *fakeGrants) Addr() string { return "@handover" }

func TestCreatedRegionCarriesItsHandover(t *testing.T) {
	a, _, _ := newTestRegionAPI()
	g := &fakeGrants{}
	a.grants = g
	info, err := a.CreateRegion(context.Background(), &messages.CreateRegionRequest{EngineId: "e", RegionId: "r", Layout: actors.LayoutToProto(testLayout())})
	if err != nil {
		t.Fatal(err)
	}
	if info.HandoverSocket != "@handover" || info.HandoverToken != "tok-r" || len(g.granted) != 1 {
		t.Fatalf("handover %q token %q grants %v; want the socket and a token for e/r", info.HandoverSocket, info.HandoverToken, g.granted)
	}
}
