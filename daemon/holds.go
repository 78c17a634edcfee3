package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/config"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/lease"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests/activation"
)

// holdAPI answers the hold calls (hold.create, renew, release, inspect) and
// the peer side of a pull (peer.descriptors, peer.pullend). It owns no
// state: the holds are actors, found through the directory.
type holdAPI struct {
	cfg     config.Config // member_id, release, retain_s, claim_s, holds_max_per_engine, pull_timeout_ms
	dir     holdDirectory
	actors  holdActors
	regions regionLeaser
	// binder binds a hold to its request's engine from the request's
	// durable state (rebind.go); nil when the request API is off.
	binder holdBinder
	log    *slog.Logger
}

// holdDirectory is what holdAPI reads of the live and ended holds
// (actors.HoldTable).
type holdDirectory interface {
	Lookup(id string) (e *actors.HoldEntry, st lease.State, ended bool)
	CountEngine(engine string) int
	ByEngine(engine string) map[string]*actors.HoldEntry
}

// holdActors reaches the hold actors: the hold supervisor that creates them and
// each hold by its pid (holdactors.go).
type holdActors interface {
	// create asks the hold supervisor to start a hold.
	create(msg *actors.CreateHold) (actors.Reply, error)
	// ask sends msg to a hold and waits for its Reply.
	ask(pid *actor.PID, msg any) (actors.Reply, error)
	// tell sends msg to a hold without waiting: f gets the Reply on the
	// hold's goroutine, or dead=true when the hold was gone.
	tell(pid *actor.PID, msg any, f func(rep actors.Reply, dead bool)) error
}

// regionLeaser lends a registered region for as long as a hold or pull
// uses it (kvmem.RegionTable.Acquire).
type regionLeaser interface {
	Acquire(engine, id string) (*kvmem.Mapped, func(), error)
}

// holdBinder applies the rebind rule before a call made for a request
// (activation.BindCall).
type holdBinder interface {
	bind(call activation.BindCall)
}

// askTimeout bounds one request to a hold actor.
const askTimeout = 5 * time.Second

var transferIDRe = regexp.MustCompile(`^[0-9a-f]{32}$`)

// CreateHold holds blocks of a registered region and returns the params.
func (h *holdAPI) CreateHold(ctx context.Context, r *messages.CreateHoldRequest) (*messages.CreateHoldReply, error) {
	if err := engineCall(ctx, &r.EngineId); err != nil {
		return nil, err
	}
	if r.Consumer != "" {
		if err := requireToken("consumer", r.Consumer); err != nil {
			return nil, err
		}
	}
	mode := h.cfg.Release
	if r.Release != "" {
		mode = r.Release
	}
	m, err := lease.ParseMode(mode)
	if err != nil {
		return nil, api.Errorf(api.CodeBadRequest, "%v", err)
	}
	retain := h.cfg.Retain
	if r.RetainS != 0 {
		if r.RetainS > 24*3600 {
			return nil, api.Errorf(api.CodeBadRequest, "retain_s=%d: at most 86400", r.RetainS)
		}
		retain = time.Duration(r.RetainS) * time.Second
	}
	if n := h.dir.CountEngine(r.EngineId); n >= h.cfg.HoldsMaxPerEngine {
		return nil, api.Errorf(api.CodeOverloaded, "engine %s has %d live holds (holds_max_per_engine=%d): release some first", r.EngineId, n, h.cfg.HoldsMaxPerEngine)
	}
	region, release, err := h.regions.Acquire(r.EngineId, r.RegionId)
	if err != nil {
		return nil, api.Errorf(api.CodeUnknownRegion, "%v", err)
	}
	if err := region.CheckBroken(); err != nil {
		release()
		return nil, err
	}
	if err := kvmem.ValidateBlockIDs(r.BlockIds, region.Region.Layout.Blocks); err != nil {
		release()
		return nil, err
	}
	if err := region.Region.Layout.CheckExtents(r.BlockIds); err != nil {
		release()
		return nil, err
	}
	ranks, releaseRanks, err := h.acquireRanks(r, region.Region.Layout)
	if err != nil {
		release()
		return nil, err
	}
	rep, err := h.actors.create(&actors.CreateHold{
		ID: actors.NewTransferID(), Req: r, Region: region, ReleaseRegion: release, MoreRanks: ranks, ReleaseMoreRanks: releaseRanks,
		Lease: lease.Config{Retain: retain, Mode: m, Owner: r.EngineId, Consumer: r.Consumer, Claim: h.cfg.Claim},
	})
	if err != nil {
		return nil, err
	}
	return rep.Create, nil
}

// acquireRanks acquires the regions of TP ranks 1 .. tp_size-1 that a hold
// of rank 0's region laid out as l spans (rank_region_ids): each must be
// the engine's, laid out as l but for its rank. release gives them back.
func (h *holdAPI) acquireRanks(r *messages.CreateHoldRequest, l kvmem.Layout) (ranks []*kvmem.Mapped, release func(), err error) {
	if uint64(len(r.RankRegionIds)) != uint64(l.TPSize)-1 || l.TPRank != 0 {
		return nil, nil, api.Errorf(api.CodeBadRequest, "region %s is rank %d of tp_size %d and %d rank_region_ids are given: name rank 0's region in region_id and ranks 1..%d's in rank_region_ids, in order",
			r.RegionId, l.TPRank, l.TPSize, len(r.RankRegionIds), l.TPSize-1)
	}
	var releases []func()
	release = func() {
		for _, f := range releases {
			f()
		}
	}
	for i, id := range r.RankRegionIds {
		if err := requireToken("rank_region_ids", id); err != nil {
			release()
			return nil, nil, err
		}
		m, rel, err := h.regions.Acquire(r.EngineId, id)
		if err != nil {
			release()
			return nil, nil, api.Errorf(api.CodeUnknownRegion, "rank %d: %v", i+1, err)
		}
		releases = append(releases, rel)
		want := l
		want.TPRank = uint32(i + 1)
		if m.Region.Layout != want {
			release()
			return nil, nil, api.Errorf(api.CodeBadLayout, "region %s (rank_region_ids[%d]) is not laid out as region %s for rank %d", id, i, r.RegionId, i+1)
		}
		if err := m.CheckBroken(); err != nil {
			release()
			return nil, nil, err
		}
		ranks = append(ranks, m)
	}
	return ranks, release, nil
}

// askHold sends msg to the live hold named id, mapping ended and unknown
// transfers to their codes.
func (h *holdAPI) askHold(id string, msg any) (actors.Reply, error) {
	for attempt := 0; attempt < 2; attempt++ {
		e, err := h.liveHold(id)
		if err != nil {
			return actors.Reply{}, err
		}
		rep, err := h.actors.ask(e.PID, msg)
		if errors.Is(err, actor.ErrDeadLetter) {
			continue // the hold ended between lookup and ask: look again
		}
		return rep, err
	}
	return actors.Reply{}, api.Errorf(api.CodeUnknownTransfer, "transfer %s ended", id)
}

// tellHold sends msg to the live hold named id without waiting for its
// answer: f gets the hold's Reply on the hold actor's goroutine, or
// dead=true when the hold stopped between the lookup and the send (its
// directory entry then says why: ask again with askHold). Ended and
// unknown transfers are errors at once, as for askHold; f is then never
// called.
func (h *holdAPI) tellHold(id string, msg any, f func(rep actors.Reply, dead bool)) error {
	e, err := h.liveHold(id)
	if err != nil {
		return err
	}
	return h.actors.tell(e.PID, msg, f)
}

// liveHold is the directory entry of the live hold named id, or the error
// that says it ended or is unknown here.
func (h *holdAPI) liveHold(id string) (*actors.HoldEntry, error) {
	if !transferIDRe.MatchString(id) {
		return nil, api.Errorf(api.CodeBadRequest, "transfer_id=%q: want 32 lowercase hex digits", id)
	}
	e, st, ended := h.dir.Lookup(id)
	switch {
	case ended:
		return nil, endedError(id, st)
	case e == nil:
		return nil, api.Errorf(api.CodeUnknownTransfer, "transfer %s is not held by member %s", id, h.cfg.MemberID)
	}
	return e, nil
}

// askBound is askHold for an operation of requester on behalf of request
// requestID. When the request's durable state names requester as its
// engine and this hold as its transfer (written by the request's current
// activation, moved only by the store's compare-and-set), the hold is first
// bound to requester at the request's epoch: an unbound hold at the decode
// leg's request.start, a bound one after a resume moved the request (at a
// newer epoch). A bound hold then serves only its consumer (and its owner's
// release). The caller's claim alone binds or moves nothing.
func (h *holdAPI) askBound(id, requester, requestID string, msg any) (actors.Reply, error) {
	if call := (activation.BindCall{Transfer: id, Requester: requester, Request: requestID}); call.Applies() && h.binder != nil {
		h.binder.bind(call)
	}
	return h.askHold(id, msg)
}

func endedError(id string, st lease.State) error {
	switch st {
	case lease.Expired:
		return api.Errorf(api.CodeExpired, "transfer %s expired; its blocks were freed", id)
	case lease.EngineGone:
		return api.Errorf(api.CodeEngineGone, "transfer %s ended: its engine went away", id)
	case lease.Unclaimed:
		return api.Errorf(api.CodeExpired, "transfer %s expired unclaimed: no decode engine pulled, renewed or bound it within claim_s; its blocks were freed", id)
	case lease.ShutDown, lease.Aborted:
		return api.Errorf(api.CodeReleased, "transfer %s ended (%s); its blocks were freed", id, st)
	}
	return api.Errorf(api.CodeReleased, "transfer %s was %s; its blocks were freed", id, st)
}

// Renew extends a hold's lease.
func (h *holdAPI) Renew(ctx context.Context, r *messages.HoldRef) (*messages.HoldStatus, error) {
	if err := acting(ctx, "requester", &r.Requester); err != nil {
		return nil, err
	}
	rep, err := h.askBound(r.TransferId, r.Requester, r.RequestId, &actors.RenewHold{By: r.Requester})
	return rep.Status, err
}

// Release ends a hold.
func (h *holdAPI) Release(ctx context.Context, r *messages.HoldRef) (*messages.HoldStatus, error) {
	if err := acting(ctx, "requester", &r.Requester); err != nil {
		return nil, err
	}
	rep, err := h.askBound(r.TransferId, r.Requester, r.RequestId, &actors.ReleaseHold{By: r.Requester})
	return rep.Status, err
}

// Inspect returns a hold's status; an ended hold reports its final state.
// An engine may inspect only a hold it owns or that is bound to it (the
// status names the holder engine's blocks).
func (h *holdAPI) Inspect(ctx context.Context, r *messages.HoldRef) (*messages.HoldStatus, error) {
	rep, err := h.askHold(r.TransferId, &actors.InspectHold{})
	if caller, ok := api.CallerEngine(ctx); ok && err == nil && caller != rep.Status.GetEngineId() && caller != rep.Consumer {
		return nil, fmt.Errorf("hold.inspect by %q: %w", caller, lease.ErrNotYours)
	}
	if err != nil {
		if _, st, ended := h.dir.Lookup(r.TransferId); ended {
			return &messages.HoldStatus{TransferId: r.TransferId, State: st.String(), Freed: true}, nil
		}
	}
	return rep.Status, err
}

// Descriptors starts a peer's read of a hold. It does not wait for the
// hold: the hold actor answers the reader itself. A pull for a request
// whose hold is not bound to the reader for it yet (its first pull after
// request.start, or after a resume moved the request) is first bound from
// the request's durable state, on a goroutine of its own (askBound).
func (h *holdAPI) Descriptors(_ context.Context, r *messages.DescriptorsRequest, answer api.Answer[*messages.Descriptors]) {
	if err := requireToken("pull_id", r.PullId); err != nil {
		answer(nil, err)
		return
	}
	l := actors.LayoutFromProto(r.Layout)
	if err := l.Validate(); err != nil {
		answer(nil, err)
		return
	}
	timeout, err := pullTimeout(r.TimeoutMs, h.cfg.PullTimeout)
	if err != nil {
		answer(nil, err)
		return
	}
	read := actors.StartRead{By: r.Requester, PullID: r.PullId, Timeout: timeout, Layout: l}
	// askBound, on a goroutine: the answer when the hold must be bound to
	// the pull's request first, or when it stopped as it was told.
	slow := func() {
		go func() {
			rep, err := h.askBound(r.TransferId, r.Requester, r.RequestId, &read)
			answer(rep.Desc, err)
		}()
	}
	fast := read
	if r.RequestId != "" && r.Requester != "" && h.binder != nil {
		fast.Request = r.RequestId // answered Unbound unless bound to it already
	}
	err = h.tellHold(r.TransferId, &fast, func(rep actors.Reply, dead bool) {
		if dead || rep.Unbound {
			slow()
			return
		}
		answer(rep.Desc, rep.Err)
	})
	if err != nil {
		answer(nil, err)
	}
}

// PullEnd ends a peer's read of a hold.
func (h *holdAPI) PullEnd(_ context.Context, r *messages.PullEnd) (*messages.HoldStatus, error) {
	rep, err := h.askHold(r.TransferId, &actors.EndRead{PullID: r.PullId, OK: r.Ok, By: r.Requester})
	return rep.Status, err
}

// dropEngine ends every hold of engine (engine.gone) and counts those
// that answered.
func (h *holdAPI) dropEngine(engine string) (dropped uint32) {
	for id, e := range h.dir.ByEngine(engine) {
		if e.Quarantined.Load() {
			continue // ended already; its blocks stay held for good
		}
		if _, err := h.actors.ask(e.PID, &actors.EngineGone{}); err != nil {
			h.log.Warn("engine gone: hold did not answer", "transfer", id, "err", err)
			continue
		}
		dropped++
	}
	return dropped
}

// statuses is the status of each live hold in entries (engine.state,
// member.status). A hold whose actor does not answer (busy, stopped: a
// quarantined hold) is listed from its directory entry: an engine that
// rebuilds its holds from engine.state must never read a hold that still
// keeps its blocks as gone.
func (h *holdAPI) statuses(entries map[string]*actors.HoldEntry) []*messages.HoldStatus {
	var out []*messages.HoldStatus
	for id, e := range entries {
		if e.Quarantined.Load() {
			out = append(out, &messages.HoldStatus{TransferId: id, State: "quarantined", EngineId: e.Engine, RegionId: e.Region, CreatedUnixMs: e.Created.UnixMilli()})
			continue
		}
		if rep, err := h.actors.ask(e.PID, &actors.InspectHold{}); err == nil && rep.Status != nil {
			out = append(out, rep.Status)
			continue
		}
		state := lease.State(e.State.Load()).String()
		if e.Quarantined.Load() {
			state = "quarantined"
		}
		out = append(out, &messages.HoldStatus{TransferId: id, State: state, EngineId: e.Engine, RegionId: e.Region, CreatedUnixMs: e.Created.UnixMilli()})
	}
	return out
}
