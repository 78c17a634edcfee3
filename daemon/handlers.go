package daemon

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/regionfile"
	"github.com/connex/connex/lease"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests/activation"
	"github.com/connex/connex/transport"
)

// askTimeout bounds one request to a hold actor.
const askTimeout = 5 * time.Second

// maxPullTimeout bounds a caller-chosen pull deadline: a holder never keeps
// blocks pinned for a reader longer than this after it stops reporting.
const maxPullTimeout = time.Hour

// pullTimeout is the caller's timeout_ms, or the default, within bounds.
func (d *Daemon) pullTimeout(ms uint32) (time.Duration, error) {
	if ms == 0 {
		return d.cfg.PullTimeout, nil
	}
	t := time.Duration(ms) * time.Millisecond
	if t > maxPullTimeout {
		return 0, api.Errorf(api.CodeBadRequest, "timeout_ms=%d: at most %d", ms, maxPullTimeout.Milliseconds())
	}
	return t, nil
}

var transferIDRe = regexp.MustCompile(`^[0-9a-f]{32}$`)

func requireToken(field, v string) error {
	if !api.ValidToken(v) {
		return api.Errorf(api.CodeBadRequest, "%s=%q: must be 1-128 bytes of printable UTF-8 without spaces, control characters, '.', '*' or '>'", field, v)
	}
	return nil
}

// engineCall checks an engine-scoped call: under NATS authentication the
// caller's own engine replaces *engineID (acting), and the id must be a
// valid subject token.
func engineCall(ctx context.Context, engineID *string) error {
	if err := acting(ctx, "engine_id", engineID); err != nil {
		return err
	}
	return requireToken("engine_id", *engineID)
}

// engineRegionCall is engineCall for a call about one of the engine's
// regions: regionID must be a valid subject token too.
func engineRegionCall(ctx context.Context, engineID *string, regionID string) error {
	if err := engineCall(ctx, engineID); err != nil {
		return err
	}
	return requireToken("region_id", regionID)
}

func regionInfo(m *kvmem.Mapped) *messages.RegionInfo {
	c := m.Blocks.Counts()
	return &messages.RegionInfo{
		EngineId: m.Engine, RegionId: m.ID, Path: m.Region.Path, Layout: actors.LayoutToProto(m.Region.Layout),
		Bytes: m.Region.Layout.Size(), BlocksFree: c.Free, BlocksHeld: c.Held, BlocksReading: c.Reading, BlocksWriting: c.Writing,
		Memory: m.Region.Memory,
	}
}

// CreateRegion allocates a region for an engine, which maps the returned
// path: the data plane's shared memory when it can allocate some (UCX:
// one-sided reads on this host), else a memfd. Creating the same engine,
// id and layout again returns the existing region.
func (d *Daemon) CreateRegion(ctx context.Context, r *messages.CreateRegionRequest) (*messages.RegionInfo, error) {
	if err := engineRegionCall(ctx, &r.EngineId, r.RegionId); err != nil {
		return nil, err
	}
	l := actors.LayoutFromProto(r.Layout)
	if err := l.Validate(); err != nil {
		return nil, err
	}
	// createdAs reports whether m is a region created with layout l.
	createdAs := func(m *kvmem.Mapped) bool { return m.Region.Memory != kvmem.MemoryFile && m.Region.Layout == l }
	if m, err := d.regions.Lookup(r.EngineId, r.RegionId); err == nil && !m.Broken() {
		if createdAs(m) {
			return d.createdInfo(m)
		}
		return nil, api.Errorf(api.CodeBadRequest, "region %s/%s already exists (%s, %s) with another layout or memory",
			r.EngineId, r.RegionId, m.Region.Memory, m.Region.Path)
	}
	if err := d.regions.Admit(r.EngineId, l); err != nil {
		return nil, err
	}
	reg, err := d.newRegion(r.EngineId+"-"+r.RegionId, l)
	if err != nil {
		return nil, err
	}
	m, err := d.regions.Add(r.EngineId, r.RegionId, reg)
	if err != nil {
		_ = reg.Close()
		// A concurrent create (a client retrying) may have won: same
		// answer as above.
		if m, lerr := d.regions.Lookup(r.EngineId, r.RegionId); lerr == nil && createdAs(m) && !m.Broken() {
			return d.createdInfo(m)
		}
		return nil, api.Errorf(api.CodeBadRequest, "%v", err)
	}
	d.log.Info("region created", "engine", r.EngineId, "region", r.RegionId, "bytes", l.Size(), "memory", reg.Memory, "path", reg.Path)
	return d.createdInfo(m)
}

// newRegion allocates memory for a created region.
func (d *Daemon) newRegion(name string, l kvmem.Layout) (*kvmem.Region, error) {
	if d.Backend.Caps().Allocate {
		al, err := transport.Promised[transport.Allocator](d.Backend, "Allocate")
		var mem transport.Allocation
		if err == nil {
			mem, err = al.Allocate(int(l.Size()))
		}
		if err == nil {
			// UCX commits the memory when it allocates (Allocate checks
			// the room in /dev/shm, which containers often keep small;
			// a memfd is not bound by it).
			reg, rerr := kvmem.NewRegion(mem.Path(), l, kvmem.MemoryAllocated(d.Backend.Name()), mem.Bytes(), mem.Free)
			if rerr == nil {
				regionfile.Populate(mem.Bytes()[:l.Size()])
				return reg, nil
			}
			_ = mem.Free()
			err = rerr
		}
		d.log.Warn("data plane cannot allocate shared memory; using a memfd, which peers read through the holder",
			"backend", d.Backend.Name(), "err", err)
	}
	if d.cfg.ShmDir != "" {
		return regionfile.CreateShm(d.cfg.ShmDir, name, l)
	}
	return regionfile.CreateMemfd(name, l)
}

// RegisterRegion maps an engine's region file.
func (d *Daemon) RegisterRegion(ctx context.Context, r *messages.RegisterRegionRequest) (*messages.RegionInfo, error) {
	if err := engineRegionCall(ctx, &r.EngineId, r.RegionId); err != nil {
		return nil, err
	}
	if r.Path == "" {
		return nil, api.Errorf(api.CodeBadRequest, "path is empty: give the region file the engine created")
	}
	m, err := d.regions.Register(r.EngineId, r.RegionId, r.Path, actors.LayoutFromProto(r.Layout))
	if err != nil {
		if errors.Is(err, kvmem.ErrRegionExists) {
			return nil, api.Errorf(api.CodeBadRequest, "%v", err)
		}
		return nil, err
	}
	return regionInfo(m), nil
}

// InspectRegion returns a region's accounting.
func (d *Daemon) InspectRegion(ctx context.Context, r *messages.RegionRef) (*messages.RegionInfo, error) {
	if err := engineRegionCall(ctx, &r.EngineId, r.RegionId); err != nil {
		return nil, err
	}
	m, err := d.regions.Lookup(r.EngineId, r.RegionId)
	if err != nil {
		return nil, api.Errorf(api.CodeUnknownRegion, "%v", err)
	}
	return regionInfo(m), nil
}

// EngineGone ends every hold of the engine and unmaps its regions.
func (d *Daemon) EngineGone(ctx context.Context, r *messages.EngineGoneRequest) (*messages.EngineGoneReply, error) {
	if err := engineCall(ctx, &r.EngineId); err != nil {
		return nil, err
	}
	var out messages.EngineGoneReply
	for id, e := range d.dir.ByEngine(r.EngineId) {
		if _, err := d.ask(e.PID, &actors.EngineGone{}); err != nil {
			d.log.Warn("engine gone: hold did not answer", "transfer", id, "err", err)
			continue
		}
		out.HoldsDropped++
	}
	out.RegionsDropped = uint32(d.regions.DropEngine(r.EngineId))
	if d.handover != nil {
		d.handover.Forget(r.EngineId)
	}
	d.dropEngine(r.EngineId)
	return &out, nil
}

// CreateHold holds blocks of a registered region and returns the params.
func (d *Daemon) CreateHold(ctx context.Context, r *messages.CreateHoldRequest) (*messages.CreateHoldReply, error) {
	if err := engineCall(ctx, &r.EngineId); err != nil {
		return nil, err
	}
	if r.Consumer != "" {
		if err := requireToken("consumer", r.Consumer); err != nil {
			return nil, err
		}
	}
	mode := d.cfg.Release
	if r.Release != "" {
		mode = r.Release
	}
	m, err := lease.ParseMode(mode)
	if err != nil {
		return nil, api.Errorf(api.CodeBadRequest, "%v", err)
	}
	retain := d.cfg.Retain
	if r.RetainS != 0 {
		if r.RetainS > 24*3600 {
			return nil, api.Errorf(api.CodeBadRequest, "retain_s=%d: at most 86400", r.RetainS)
		}
		retain = time.Duration(r.RetainS) * time.Second
	}
	if n := d.dir.CountEngine(r.EngineId); n >= d.cfg.HoldsMaxPerEngine {
		return nil, api.Errorf(api.CodeOverloaded, "engine %s has %d live holds (holds_max_per_engine=%d): release some first", r.EngineId, n, d.cfg.HoldsMaxPerEngine)
	}
	region, release, err := d.regions.Acquire(r.EngineId, r.RegionId)
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
	ranks, releaseRanks, err := d.acquireRanks(r, region.Region.Layout)
	if err != nil {
		release()
		return nil, err
	}
	id := actors.NewTransferID()
	rep, err := d.ask(d.holds, &actors.CreateHold{
		ID: id, Req: r, Region: region, ReleaseRegion: release, MoreRanks: ranks, ReleaseMoreRanks: releaseRanks,
		Lease: lease.Config{Retain: retain, Mode: m, Owner: r.EngineId, Consumer: r.Consumer, Claim: d.cfg.Claim},
	})
	if err != nil {
		return nil, err
	}
	return rep.Create, nil
}

// acquireRanks acquires the regions of TP ranks 1 .. tp_size-1 that a hold
// of rank 0's region laid out as l spans (rank_region_ids): each must be
// the engine's, laid out as l but for its rank. release gives them back.
func (d *Daemon) acquireRanks(r *messages.CreateHoldRequest, l kvmem.Layout) (ranks []*kvmem.Mapped, release func(), err error) {
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
		m, rel, err := d.regions.Acquire(r.EngineId, id)
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

// ask sends a message to an actor and waits for its Reply.
func (d *Daemon) ask(pid *actor.PID, msg any) (actors.Reply, error) {
	res, err := d.system.Root.RequestFuture(pid, msg, askTimeout).Result()
	if err != nil {
		return actors.Reply{}, err
	}
	rep, ok := res.(actors.Reply)
	if !ok {
		return actors.Reply{}, api.Errorf(api.CodeInternal, "unexpected reply %T", res)
	}
	return rep, rep.Err
}

// askHold sends msg to the live hold named id, mapping ended and unknown
// transfers to their codes.
func (d *Daemon) askHold(id string, msg any) (actors.Reply, error) {
	for attempt := 0; attempt < 2; attempt++ {
		e, err := d.liveHold(id)
		if err != nil {
			return actors.Reply{}, err
		}
		rep, err := d.ask(e.PID, msg)
		if errors.Is(err, actor.ErrDeadLetter) {
			continue // the hold ended between lookup and ask: look again
		}
		return rep, err
	}
	return actors.Reply{}, api.Errorf(api.CodeUnknownTransfer, "transfer %s ended", id)
}

// liveHold is the directory entry of the live hold named id, or the error
// that says it ended or is unknown here.
func (d *Daemon) liveHold(id string) (*actors.HoldEntry, error) {
	if !transferIDRe.MatchString(id) {
		return nil, api.Errorf(api.CodeBadRequest, "transfer_id=%q: want 32 lowercase hex digits", id)
	}
	e, st, ended := d.dir.Lookup(id)
	switch {
	case ended:
		return nil, endedError(id, st)
	case e == nil:
		return nil, api.Errorf(api.CodeUnknownTransfer, "transfer %s is not held by member %s", id, d.cfg.MemberID)
	}
	return e, nil
}

// holderAnswers reports whether member's API answers within a few
// heartbeats: a killed holder's NATS connection is gone, which NATS says at
// once (no responders); a frozen one does not answer in time.
func (d *Daemon) holderAnswers(member string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
	defer cancel()
	_, err := (&api.Client{NC: d.Bus.Conn, Member: member}).Inspect(ctx, &messages.HoldRef{TransferId: strings.Repeat("0", 32)})
	switch api.CodeOf(err) {
	case api.CodePeerUnavailable, api.CodeTimeout:
		return false
	}
	return true
}

// askBound is askHold for an operation of requester on behalf of request
// requestID. When the request's durable state names requester as its
// engine and this hold as its transfer (written by the request's current
// activation, moved only by the store's compare-and-set), the hold is first
// bound to requester at the request's epoch: an unbound hold at the decode
// leg's request.start, a bound one after a resume moved the request (at a
// newer epoch). A bound hold then serves only its consumer (and its owner's
// release). The caller's claim alone binds or moves nothing.
func (d *Daemon) askBound(id, requester, requestID string, msg any) (actors.Reply, error) {
	if call := (activation.BindCall{Transfer: id, Requester: requester, Request: requestID}); call.Applies() && d.reqStore != nil {
		d.bindToRequest(call)
	}
	return d.askHold(id, msg)
}

// bindToRequest binds the call's hold to its requester if the rebind rule
// (activation.BindCall) says so from the request's stored state; otherwise
// it leaves the hold as it is (the operation that follows is judged by the
// binding).
func (d *Daemon) bindToRequest(call activation.BindCall) {
	rep, err := d.askHold(call.Transfer, &actors.InspectHold{})
	if err != nil || call.Bound(rep.Consumer, rep.Request) {
		return
	}
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, _, gerr := d.reqStore.Get(c, call.Request)
	epoch, ok := call.Rebind(st, gerr)
	if !ok {
		return
	}
	if _, rerr := d.askHold(call.Transfer, &actors.RebindHold{Consumer: call.Requester, Request: call.Request, Epoch: epoch}); rerr != nil {
		d.log.Info("hold not bound to the request's engine", "transfer", call.Transfer, "request", call.Request, "consumer", call.Requester, "epoch", epoch, "err", rerr)
		return
	}
	d.log.Info("hold bound to the request's engine", "transfer", call.Transfer, "request", call.Request, "consumer", call.Requester, "epoch", epoch, "was", rep.Consumer)
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
func (d *Daemon) Renew(ctx context.Context, r *messages.HoldRef) (*messages.HoldStatus, error) {
	if err := acting(ctx, "requester", &r.Requester); err != nil {
		return nil, err
	}
	rep, err := d.askBound(r.TransferId, r.Requester, r.RequestId, &actors.RenewHold{By: r.Requester})
	return rep.Status, err
}

// Release ends a hold.
func (d *Daemon) Release(ctx context.Context, r *messages.HoldRef) (*messages.HoldStatus, error) {
	if err := acting(ctx, "requester", &r.Requester); err != nil {
		return nil, err
	}
	rep, err := d.askBound(r.TransferId, r.Requester, r.RequestId, &actors.ReleaseHold{By: r.Requester})
	return rep.Status, err
}

// Inspect returns a hold's status; an ended hold reports its final state.
// An engine may inspect only a hold it owns or that is bound to it (the
// status names the holder engine's blocks).
func (d *Daemon) Inspect(ctx context.Context, r *messages.HoldRef) (*messages.HoldStatus, error) {
	rep, err := d.askHold(r.TransferId, &actors.InspectHold{})
	if caller, ok := api.CallerEngine(ctx); ok && err == nil && caller != rep.Status.GetEngineId() && caller != rep.Consumer {
		return nil, fmt.Errorf("hold.inspect by %q: %w", caller, lease.ErrNotYours)
	}
	if err != nil {
		if _, st, ended := d.dir.Lookup(r.TransferId); ended {
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
func (d *Daemon) Descriptors(_ context.Context, r *messages.DescriptorsRequest, answer api.Answer[*messages.Descriptors]) {
	if err := requireToken("pull_id", r.PullId); err != nil {
		answer(nil, err)
		return
	}
	l := actors.LayoutFromProto(r.Layout)
	if err := l.Validate(); err != nil {
		answer(nil, err)
		return
	}
	timeout, err := d.pullTimeout(r.TimeoutMs)
	if err != nil {
		answer(nil, err)
		return
	}
	read := actors.StartRead{By: r.Requester, PullID: r.PullId, Timeout: timeout, Layout: l}
	// askBound, on a goroutine: the answer when the hold must be bound to
	// the pull's request first, or when it stopped as it was told.
	slow := func() {
		go func() {
			rep, err := d.askBound(r.TransferId, r.Requester, r.RequestId, &read)
			answer(rep.Desc, err)
		}()
	}
	fast := read
	if r.RequestId != "" && r.Requester != "" && d.reqStore != nil {
		fast.Request = r.RequestId // answered Unbound unless bound to it already
	}
	err = d.tellHold(r.TransferId, &fast, func(rep actors.Reply, dead bool) {
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
func (d *Daemon) PullEnd(_ context.Context, r *messages.PullEnd) (*messages.HoldStatus, error) {
	rep, err := d.askHold(r.TransferId, &actors.EndRead{PullID: r.PullId, OK: r.Ok, By: r.Requester})
	return rep.Status, err
}

// StartPull validates a pull, claims its destination blocks and starts a
// puller actor. The outcome arrives as a PullDone notice.
func (d *Daemon) StartPull(ctx context.Context, r *messages.StartPullRequest) (*messages.StartPullReply, error) {
	if err := acting(ctx, "engine_id", &r.EngineId); err != nil {
		return nil, err
	}
	p := r.Params
	if p == nil {
		return nil, api.Errorf(api.CodeBadRequest, "params (kv_transfer_params) missing")
	}
	if !transferIDRe.MatchString(p.TransferId) {
		return nil, api.Errorf(api.CodeBadRequest, "params.transfer_id=%q: want 32 lowercase hex digits", p.TransferId)
	}
	if err := requireToken("params.remote_ctrl.member", p.RemoteCtrl.GetMember()); err != nil {
		return nil, err
	}
	if err := requireToken("engine_id", r.EngineId); err != nil {
		return nil, err
	}
	if got, want := p.RemoteCtrl.GetBackend(), d.Backend.Name(); got != "" && got != want {
		return nil, api.Errorf(api.CodeIncompatible, "the hold %s lives on member %s, whose data plane is %q; this member's is %q (set backend to the same value on every member)",
			p.TransferId, p.RemoteCtrl.GetMember(), got, want)
	}
	pullID := r.PullId
	if pullID == "" {
		pullID = actors.NewTransferID()[:16]
	} else if err := requireToken("pull_id", pullID); err != nil {
		return nil, err
	}
	timeout, err := d.pullTimeout(r.TimeoutMs)
	if err != nil {
		return nil, err
	}
	// pull.start is idempotent while the pull runs and for a minute after
	// it ended: an engine whose call timed out (its NATS server died with
	// the answer) sends it again and is told the pull runs; its pull.done
	// comes once (pulltable.go).
	if claimed, same := d.inflight.claim(r.EngineId, pullID, p.TransferId, d.now()); !claimed {
		if same {
			return &messages.StartPullReply{PullId: pullID}, nil
		}
		return nil, api.Errorf(api.CodeBadRequest, "pull_id=%q is in use by another running pull; give each pull its own id", pullID)
	}
	dst, release, err := d.regions.Acquire(r.EngineId, r.RegionId)
	if err != nil {
		d.inflight.forget(pullID)
		return nil, api.Errorf(api.CodeUnknownRegion, "%v", err)
	}
	l := dst.Region.Layout
	fail := func(err error) (*messages.StartPullReply, error) {
		release()
		d.inflight.forget(pullID)
		return nil, err
	}
	if err := dst.CheckBroken(); err != nil {
		return fail(err)
	}
	if err := kvmem.CheckPull(p.TpSize, p.BlockSize, len(p.RemoteBlockIds), p.RemoteNumTokens, len(r.BlockIds), l); err != nil {
		return fail(err)
	}
	if err := kvmem.ValidateBlockIDs(r.BlockIds, l.Blocks); err != nil {
		return fail(err)
	}
	if err := dst.Blocks.BeginWrite(r.BlockIds); err != nil {
		return fail(err)
	}
	pull := &actors.Pull{ID: pullID, Params: p, Dst: dst, DstBlocks: r.BlockIds, Timeout: timeout, Stall: min(d.cfg.PullStall, timeout), ReleaseRegion: release}
	actors.StartPuller(d.pdeps, pull)
	return &messages.StartPullReply{PullId: pullID}, nil
}
