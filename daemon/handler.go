package daemon

import (
	"context"
	"slices"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// handler is the subject API (api.Handler) of one daemon, composed of its
// concerns: each answers its own calls (regions.go, holds.go, pulls.go,
// requests.go, engines.go). The calls that span concerns (engine.gone,
// engine.notices, engine.state, member.status) are the daemon's own.
type handler struct {
	*Daemon
}

var _ api.Handler = handler{}

// The calls forwarded to the concerns, one line each.

func (h handler) CreateRegion(ctx context.Context, r *messages.CreateRegionRequest) (*messages.RegionInfo, error) {
	return h.regionAPI.CreateRegion(ctx, r)
}
func (h handler) RegisterRegion(ctx context.Context, r *messages.RegisterRegionRequest) (*messages.RegionInfo, error) {
	return h.regionAPI.RegisterRegion(ctx, r)
}
func (h handler) InspectRegion(ctx context.Context, r *messages.RegionRef) (*messages.RegionInfo, error) {
	return h.regionAPI.InspectRegion(ctx, r)
}
func (h handler) RegisterEngine(ctx context.Context, r *messages.RegisterEngineRequest) (*messages.RegisterEngineReply, error) {
	return h.engineAPI.RegisterEngine(ctx, r)
}
func (h handler) CreateHold(ctx context.Context, r *messages.CreateHoldRequest) (*messages.CreateHoldReply, error) {
	h.activity.Touch() // work arrives: heartbeat at the full rate
	return h.holdAPI.CreateHold(ctx, r)
}
func (h handler) Renew(ctx context.Context, r *messages.HoldRef) (*messages.HoldStatus, error) {
	return h.holdAPI.Renew(ctx, r)
}
func (h handler) Release(ctx context.Context, r *messages.HoldRef) (*messages.HoldStatus, error) {
	return h.holdAPI.Release(ctx, r)
}
func (h handler) Inspect(ctx context.Context, r *messages.HoldRef) (*messages.HoldStatus, error) {
	return h.holdAPI.Inspect(ctx, r)
}
func (h handler) Descriptors(ctx context.Context, r *messages.DescriptorsRequest, answer api.Answer[*messages.Descriptors]) {
	h.holdAPI.Descriptors(ctx, r, answer)
}
func (h handler) PullEnd(ctx context.Context, r *messages.PullEnd) (*messages.HoldStatus, error) {
	return h.holdAPI.PullEnd(ctx, r)
}
func (h handler) StartPull(ctx context.Context, r *messages.StartPullRequest) (*messages.StartPullReply, error) {
	h.activity.Touch() // work arrives: heartbeat at the full rate
	return h.pullAPI.StartPull(ctx, r)
}
func (h handler) StartRequest(ctx context.Context, r *messages.StartRequestMsg) (*messages.RequestStatus, error) {
	h.activity.Touch() // work arrives: heartbeat at the full rate
	return h.requestAPI.StartRequest(ctx, r)
}
func (h handler) Progress(ctx context.Context, r *messages.RequestProgress) (*messages.RequestStatus, error) {
	return h.requestAPI.Progress(ctx, r)
}
func (h handler) FinishRequest(ctx context.Context, r *messages.FinishRequestMsg) (*messages.RequestStatus, error) {
	return h.requestAPI.FinishRequest(ctx, r)
}
func (h handler) InspectRequest(ctx context.Context, r *messages.RequestRef) (*messages.RequestStatus, error) {
	return h.requestAPI.InspectRequest(ctx, r)
}
func (h handler) Adopt(ctx context.Context, r *messages.AdoptRequestMsg) (*messages.RequestStatus, error) {
	return h.requestAPI.Adopt(ctx, r)
}
func (h handler) GrantTakeover(ctx context.Context, r *messages.StartRequestMsg) (*messages.RequestStatus, error) {
	return h.requestAPI.GrantTakeover(ctx, r)
}

// EngineGone ends every hold of the engine, unmaps its regions and forgets
// its registration.
func (h handler) EngineGone(ctx context.Context, r *messages.EngineGoneRequest) (*messages.EngineGoneReply, error) {
	if err := engineCall(ctx, &r.EngineId); err != nil {
		return nil, err
	}
	// Regions first: a hold.create that acquired one before sees it gone
	// once it is listed (the sweep below may miss it) and ends itself.
	var out messages.EngineGoneReply
	out.RegionsDropped = uint32(h.regions.DropEngine(r.EngineId))
	// Its pulls stop writing: a new instance may register the same file.
	h.pullAPI.pullers.endEngine(r.EngineId)
	out.HoldsDropped = h.holdAPI.dropEngine(r.EngineId)
	if h.handover != nil {
		h.handover.Forget(r.EngineId)
	}
	h.engineAPI.drop(r.EngineId)
	return &out, nil
}

// EngineState lists what this member keeps for an engine.
func (h handler) EngineState(ctx context.Context, r *messages.EngineStateRequest) (*messages.EngineState, error) {
	if err := engineCall(ctx, &r.EngineId); err != nil {
		return nil, err
	}
	st := &messages.EngineState{EngineId: r.EngineId, LastSeq: h.journal.Last(r.EngineId), Journal: h.journalID,
		Registration: h.engineAPI.info(r.EngineId)}
	st.Holds = h.holdAPI.statuses(h.dir.ByEngine(r.EngineId))
	st.Pulls = h.inflight.of(r.EngineId)
	st.Requests = h.requestAPI.states(r.EngineId)
	return st, ctx.Err()
}

// MemberStatus is everything this member keeps (member.status): its
// engines, holds, requests and pulls, for `connexd status`.
func (h handler) MemberStatus(ctx context.Context, _ *messages.MemberStatusRequest) (*messages.MemberStatus, error) {
	st := &messages.MemberStatus{
		MemberId: h.cfg.MemberID, Role: h.cfg.Role, Backend: h.Backend.Name(), DataAddr: PrintableAddr(h.Backend.Address()),
		StartedUnixMs: h.started.UnixMilli(), Version: Version, Pulls: h.inflight.of(""),
		Engines: h.engineAPI.live(),
	}
	st.Holds = h.holdAPI.statuses(h.dir.All())
	slices.SortFunc(st.Holds, func(a, b *messages.HoldStatus) int { return int(a.CreatedUnixMs - b.CreatedUnixMs) })
	st.Requests = h.requestAPI.states("")
	if h.cluster != nil {
		for _, m := range h.cluster.Members() {
			if m.Name != "" {
				st.ClusterMembers = append(st.ClusterMembers, m.Name)
			}
		}
		slices.Sort(st.ClusterMembers)
		st.ClusterMembers = slices.Compact(st.ClusterMembers)
	}
	return st, ctx.Err()
}
