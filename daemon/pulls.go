package daemon

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/pull"
)

// pullAPI answers pull.start: it checks a pull, claims its destination
// blocks and starts a puller. It owns the table of running pulls.
type pullAPI struct {
	backend  string        // this member's data plane (transport.Backend.Name)
	timeout  time.Duration // pull_timeout_ms: the default deadline
	stall    time.Duration // pull_stall_ms
	regions  regionLeaser
	pullers  pullStarter
	inflight *pullTable
	// starts holds pulls sent with await_start until their request's
	// start is answered (startgate.go); nil: await_start is ignored.
	starts *startGate
	clock  clock.Clock
}

// pullStarter starts a puller for a checked pull (pull.StartPuller); its
// outcome comes back as a PullDone notice.
type pullStarter interface {
	startPull(p *pull.Pull)
	// refusePull ends a checked pull without reading: its blocks and
	// region given back, err in its PullDone (pull.Refuse).
	refusePull(p *pull.Pull, err error)
	// endEngine ends every running pull of engine (engine.gone): none
	// goes on writing a region its engine left.
	endEngine(engine string)
}

// maxPullTimeout bounds a caller-chosen pull deadline: a holder never keeps
// blocks pinned for a reader longer than this after it stops reporting.
const maxPullTimeout = time.Hour

// pullTimeout is the caller's timeout_ms, or def, within bounds.
func pullTimeout(ms uint32, def time.Duration) (time.Duration, error) {
	if ms == 0 {
		return def, nil
	}
	t := time.Duration(ms) * time.Millisecond
	if t > maxPullTimeout {
		return 0, api.Errorf(api.CodeBadRequest, "timeout_ms=%d: at most %d", ms, maxPullTimeout.Milliseconds())
	}
	return t, nil
}

// StartPull validates a pull, claims its destination blocks and starts a
// puller actor. The outcome arrives as a PullDone notice.
func (a *pullAPI) StartPull(ctx context.Context, r *messages.StartPullRequest) (*messages.StartPullReply, error) {
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
	if got, want := p.RemoteCtrl.GetBackend(), a.backend; got != "" && got != want {
		return nil, api.Errorf(api.CodeIncompatible, "the hold %s lives on member %s, whose data plane is %q; this member's is %q (set backend to the same value on every member)",
			p.TransferId, p.RemoteCtrl.GetMember(), got, want)
	}
	pullID := r.PullId
	if pullID == "" {
		pullID = actors.NewTransferID()[:16]
	} else if err := requireToken("pull_id", pullID); err != nil {
		return nil, err
	}
	timeout, err := pullTimeout(r.TimeoutMs, a.timeout)
	if err != nil {
		return nil, err
	}
	if len(r.AwaitStart) > maxStartID {
		return nil, api.Errorf(api.CodeBadRequest, "await_start: %d bytes, at most %d", len(r.AwaitStart), maxStartID)
	}
	// pull.start is idempotent while the pull runs and for a minute after
	// it ended: an engine whose call timed out (its NATS server died with
	// the answer) sends it again and is told the pull runs; its pull.done
	// comes once (pulltable.go).
	if claimed, same := a.inflight.claim(r.EngineId, pullID, p.TransferId, a.clock.Now()); !claimed {
		if same {
			return &messages.StartPullReply{PullId: pullID}, nil
		}
		return nil, api.Errorf(api.CodeBadRequest, "pull_id=%q is in use by another running pull; give each pull its own id", pullID)
	}
	dst, release, err := a.regions.Acquire(r.EngineId, r.RegionId)
	if err != nil {
		a.inflight.forget(pullID)
		return nil, api.Errorf(api.CodeUnknownRegion, "%v", err)
	}
	l := dst.Region.Layout
	fail := func(err error) (*messages.StartPullReply, error) {
		release()
		a.inflight.forget(pullID)
		return nil, err
	}
	if err := dst.CheckBroken(); err != nil {
		return fail(err)
	}
	skip, tokens, err := pullSuffix(p, r.SkipBlocks, l.BlockSize)
	if err != nil {
		return fail(err)
	}
	pick, err := groupPick(p, r, l)
	if err != nil {
		return fail(err)
	}
	nSrc := len(p.RemoteBlockIds) - skip
	if pick != nil {
		nSrc, tokens = len(pick), 0
	}
	if err := kvmem.CheckPull(p.TpSize, p.BlockSize, nSrc, tokens, len(r.BlockIds), l); err != nil {
		return fail(err)
	}
	if err := kvmem.ValidateBlockIDs(r.BlockIds, l.Blocks); err != nil {
		return fail(err)
	}
	if err := l.CheckExtents(r.BlockIds); err != nil {
		return fail(err)
	}
	if err := dst.Blocks.BeginWrite(r.BlockIds); err != nil {
		return fail(err)
	}
	pl := &pull.Pull{ID: pullID, Params: p, Dst: dst, DstBlocks: r.BlockIds, Skip: skip, Pick: pick, Timeout: timeout, Stall: min(a.stall, timeout), ReleaseRegion: release}
	if r.AwaitStart == "" || a.starts == nil {
		a.pullers.startPull(pl)
		return &messages.StartPullReply{PullId: pullID}, nil
	}
	// Sent beside its request's request.start: it reads once that start
	// is answered (the hold is bound to this engine by then), within its
	// timeout counted from now (the engine's own deadline for the load
	// counts from its pull.start).
	arrived := a.clock.Now()
	a.starts.await(r.EngineId, p.TransferId, r.AwaitStart, timeout, func(err error) {
		if err == nil {
			if pl.Timeout -= a.clock.Now().Sub(arrived); pl.Timeout <= 0 {
				err = api.Errorf(api.CodeTimeout, "pull %s: its timeout (%s) passed while it waited for its request.start", pullID, timeout)
			}
			pl.Stall = min(pl.Stall, pl.Timeout)
		}
		if err != nil {
			a.pullers.refusePull(pl, err)
			return
		}
		a.pullers.startPull(pl)
	})
	return &messages.StartPullReply{PullId: pullID}, nil
}

// pullSuffix checks a pull's skip_blocks against its params and the
// destination's block size and returns it with the tokens the pull moves
// (params.remote_num_tokens less the skipped ones; 0: every slot). The
// skipped tokens must fill whole destination blocks.
func pullSuffix(p *messages.KVTransferParams, skipBlocks, dstBlockSize uint32) (skip int, tokens uint32, err error) {
	if skipBlocks == 0 {
		return 0, p.RemoteNumTokens, nil
	}
	srcBS := p.BlockSize
	if srcBS == 0 {
		srcBS = dstBlockSize
	}
	skipped := uint64(skipBlocks) * uint64(srcBS)
	switch {
	case int(skipBlocks) >= len(p.RemoteBlockIds) || (p.RemoteNumTokens > 0 && skipped >= uint64(p.RemoteNumTokens)):
		return 0, 0, api.Errorf(api.CodeBadBlockIDs, "skip_blocks=%d: the pull must read at least one of the hold's %d blocks", skipBlocks, len(p.RemoteBlockIds))
	case dstBlockSize == 0 || skipped%uint64(dstBlockSize) != 0:
		return 0, 0, api.Errorf(api.CodeBadBlockIDs, "skip_blocks=%d: %d tokens are not a whole number of this region's blocks of %d tokens", skipBlocks, skipped, dstBlockSize)
	}
	if p.RemoteNumTokens > 0 {
		tokens = p.RemoteNumTokens - uint32(skipped)
	}
	return int(skipBlocks), tokens, nil
}

// pullDeps is pullStarter over the pull package's pullers. Each engine's
// running pulls share a context of its own (under the daemon's), which
// engine.gone cancels; it lasts while the engine has pulls running.
type pullDeps struct {
	deps *pull.PullDeps

	mu      sync.Mutex
	engines map[string]*engineScope
}

type engineScope struct {
	ctx     context.Context
	cancel  context.CancelCauseFunc
	running int // pulls started under it that have not given their region back
}

func newPullDeps(deps *pull.PullDeps) *pullDeps {
	return &pullDeps{deps: deps, engines: map[string]*engineScope{}}
}

// startPull starts pl under its engine's scope, or refuses it when the
// engine went away since pl acquired its region (a pull held for its
// request's start, say): engine.gone drops the regions before it ends the
// scope, so a pull either sees its region gone here or runs under the
// scope engine.gone cancels.
func (p *pullDeps) startPull(pl *pull.Pull) {
	engine := pl.Dst.Engine
	p.mu.Lock()
	if pl.Dst.Gone() {
		p.mu.Unlock()
		pull.Refuse(p.deps, pl, api.Errorf(api.CodeEngineGone, "pull %s: engine %s went away (engine.gone) before the pull started", pl.ID, engine))
		return
	}
	s := p.scopeLocked(engine)
	s.running++
	release := pl.ReleaseRegion
	pl.ReleaseRegion = func() { // once, when the pull gives its region back
		release()
		p.ended(engine, s)
	}
	pl.Ctx = s.ctx
	p.mu.Unlock()
	pull.StartPuller(p.deps, pl)
}

func (p *pullDeps) refusePull(pl *pull.Pull, err error) { pull.Refuse(p.deps, pl, err) }

// scopeLocked is engine's scope, made at its first running pull.
func (p *pullDeps) scopeLocked(engine string) *engineScope {
	if s, ok := p.engines[engine]; ok {
		return s
	}
	base := cmp.Or[context.Context](p.deps.Ctx, context.Background())
	ctx, cancel := context.WithCancelCause(base)
	s := &engineScope{ctx: ctx, cancel: cancel}
	p.engines[engine] = s
	return s
}

// ended counts a pull of s done; the scope goes with its last pull.
func (p *pullDeps) ended(engine string, s *engineScope) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s.running--; s.running == 0 {
		if p.engines[engine] == s {
			delete(p.engines, engine)
		}
		s.cancel(nil)
	}
}

func (p *pullDeps) endEngine(engine string) {
	p.mu.Lock()
	s, ok := p.engines[engine]
	delete(p.engines, engine)
	p.mu.Unlock()
	if ok {
		s.cancel(fmt.Errorf("%w: engine %s went away (engine.gone)", context.Canceled, engine))
	}
}

// pullReservations is pullReserver over the pull package's reservations:
// an engine's request gets one when the engine has one region (its layout
// is the pull's; an engine of several regions pulls into each, and its
// pulls ask the holder themselves).
type pullReservations struct {
	deps    *pull.PullDeps
	regions interface {
		EngineLayout(engine string) (kvmem.Layout, bool)
	}
	timeout time.Duration // pull_timeout_ms: the reserved read's deadline
}

func (p pullReservations) reserve(engine, request string, params *messages.KVTransferParams) {
	if l, ok := p.regions.EngineLayout(engine); ok {
		p.deps.Reserve(engine, request, params, l, p.timeout)
	}
}

func (p pullReservations) unreserve(request string) { p.deps.Unreserve(request) }
