package actors

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/lease"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
)

// HoldDeps is what hold actors need from their daemon.
type HoldDeps struct {
	Backend transport.Backend
	Ctrl    *messages.RemoteCtrl // this member's control and data-plane address
	Dir     *HoldTable
	Notify  func(*messages.BlocksFreed) // publishes on the engine's freed subject
	// Clock reads the time and runs the lease and linger timers; nil is
	// the system clock (tests pass a clock.Fake).
	Clock   clock.Clock
	Log     *slog.Logger
	Metrics *Metrics
	// ReadSlack is added to a reader's own timeout before the holder
	// abandons its pull: the reader gives up first.
	ReadSlack time.Duration
	// Incarnation, if set, is this member's cluster id now (fresh per
	// rejoin), given to readers in Descriptors.holder_incarnation.
	Incarnation func() string

	timersOnce sync.Once
	holdTimers *holdTimers // the lease wake-ups of every hold: timers()
}

// NewTransferID returns 128 random bits in hex.
func NewTransferID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return hex.EncodeToString(b[:])
}

type holdActor struct {
	deps *HoldDeps
	spec holdSpec
	h    *lease.Hold
	held bool // creation only: accounting Hold succeeded, no lease owns it yet
	// quarantined: revoking a registration failed, so the data plane may
	// still read the blocks; free keeps them held for good (deregister).
	quarantined bool
	// freeing: the lease's Free being carried out, and which of its steps
	// are done; stopping finishes them should one panic midway (the lease
	// emits Free once, so an Abort then does nothing).
	freeing *freeSteps
	// pending: the effects of the lease's last step not applied yet, and
	// deregistering: a Deregister under way; stopping finishes the first
	// and treats the second as unproven (quarantine), should one panic.
	pending       []lease.Effect
	deregistering bool
	wake          wake        // the lease's next wake-up, in deps.timers()
	linger        clock.Timer // the stop after the end (lingerAfterFree)
	entry         *HoldEntry  // this hold's directory entry
	// the data-plane registrations (regs, perExtent, implied,
	// regionAddr) made at create, registerHold
	holdRegistration
	// more is the engine's TP ranks 1.. (holdranks.go); nil for one rank
	more *moreRanks
}

// holdSpec is what a hold keeps of its CreateHold: not the message and its
// request, which cost each live hold ~220 bytes more (make bench-holds).
type holdSpec struct {
	id            string
	blocks        []uint32      // the held block ids (the request's slice)
	region        *kvmem.Mapped // the region the blocks are in
	releaseRegion func()        // called once when the hold stops touching the region
}

func newHoldActor(deps *HoldDeps) actor.Actor {
	return &holdActor{deps: deps}
}

func (a *holdActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *CreateHold:
		a.create(ctx, m)
	case *RenewHold:
		a.step(ctx, lease.Renew{Now: a.now(), By: m.By}, func() Reply {
			a.deps.Metrics.LeaseRenewals.Add(1)
			return Reply{Status: a.status()}
		})
	case *RebindHold:
		a.step(ctx, lease.Rebind{Now: a.now(), Consumer: m.Consumer, Request: m.Request, Epoch: m.Epoch}, func() Reply { return Reply{Status: a.status()} })
	case *StartRead:
		a.startRead(ctx, m)
	case *EndRead:
		// A region that broke may have sent zeros as good bytes: the
		// pull did not succeed, and a reader that waits for this answer
		// fails it.
		broken := a.brokenRegion()
		a.step(ctx, lease.PullEnd{Now: a.now(), By: m.By, PullID: m.PullID, OK: m.OK && broken == nil}, func() Reply {
			if broken != nil && m.OK {
				return Reply{Err: fmt.Errorf("pull %s of %s: %w", m.PullID, a.id(), broken)}
			}
			return Reply{Status: a.status()}
		})
	case *ReleaseHold:
		a.step(ctx, lease.Release{Now: a.now(), By: m.By}, func() Reply { return Reply{Status: a.status()} })
	case *InspectHold:
		st := a.h.Status()
		ctx.Respond(Reply{Status: a.status(), Consumer: st.Consumer, Request: st.Request})
	case *EngineGone:
		a.step(ctx, lease.EngineGoneEvent{Now: a.now()}, func() Reply { return Reply{Status: a.status()} })
	case *Shutdown:
		a.step(ctx, lease.Shutdown{Now: a.now()}, func() Reply { return Reply{Status: a.status()} })
	case tick:
		a.step(ctx, lease.Tick{Now: a.now()}, nil)
	case *actor.Stopping:
		a.stopping(ctx)
	case *actor.Stopped:
		if a.quarantined {
			// A reader may still see the registration: the region's memory
			// must outlive it, so the hold keeps its references for the
			// process's life (a released last reference unmaps or frees
			// the region once its engine is gone, and the range could
			// come back as another engine's).
			a.deps.Log.Error("quarantined hold keeps its region mapped for good", "transfer", a.id(), "region", a.spec.region.ID)
			return
		}
		if a.spec.releaseRegion != nil {
			a.spec.releaseRegion()
		}
		if a.more != nil && a.more.release != nil {
			a.more.release()
		}
	}
}

func (d *HoldDeps) clock() clock.Clock { return clock.Or(d.Clock) }

func (a *holdActor) now() time.Time { return a.deps.clock().Now() }

func (a *holdActor) id() string {
	return a.spec.id
}

func (a *holdActor) create(ctx actor.Context, m *CreateHold) {
	a.spec = holdSpec{id: m.ID, blocks: m.Req.BlockIds, region: m.Region, releaseRegion: m.ReleaseRegion}
	if len(m.MoreRanks) > 0 {
		a.more = &moreRanks{regions: m.MoreRanks, release: m.ReleaseMoreRanks}
	}
	fail := func(err error) {
		a.deregister()
		ctx.Respond(Reply{Err: err})
		ctx.Stop(ctx.Self())
	}
	r := m.Region
	if err := r.Blocks.Hold(m.Req.BlockIds); err != nil {
		fail(fmt.Errorf("hold %s: %w", m.ID, err))
		return
	}
	a.held = true
	hr, err := registerHold(a.deps.Backend, r.Region, m.Req.BlockIds)
	if err != nil {
		_ = r.Blocks.Unhold(m.Req.BlockIds)
		a.held = false
		fail(fmt.Errorf("hold %s: %w", m.ID, err))
		return
	}
	a.holdRegistration = hr
	if a.more != nil {
		if err := a.more.holdRanks(a.deps.Backend, m.Req.BlockIds); err != nil {
			_ = r.Blocks.Unhold(m.Req.BlockIds)
			a.held = false
			fail(fmt.Errorf("hold %s: %w", m.ID, err))
			return
		}
	}
	created := a.now()
	h, err := lease.New(created, m.Lease)
	if err != nil {
		a.unholdAll()
		a.held = false
		fail(fmt.Errorf("hold %s: %w", m.ID, err))
		return
	}
	// From here on the lease owns the blocks and decides when they go back
	// (lease.Free); until here a failed or panicking creation gave them back
	// itself (held).
	a.h, a.held = h, false
	l0 := r.Region.Layout
	a.entry = &HoldEntry{PID: ctx.Self(), Engine: r.Engine, Region: r.ID, Created: created, Blocks: len(m.Req.BlockIds),
		Bytes: uint64(len(m.Req.BlockIds)) * uint64(l0.Layers) * uint64(l0.Planes) * l0.BlockBytes * uint64(1+len(m.MoreRanks))}
	a.deps.Dir.put(m.ID, a.entry)
	a.deps.Metrics.HoldsCreated.Add(1)
	a.deps.timers().bind(&a.wake, ctx.Self(), ctx.ActorSystem())
	if r.Gone() {
		// engine.gone dropped the region while this hold was being made,
		// and its sweep of the engine's holds may have run before the
		// directory listed this one: end it as those ended (its blocks
		// back, its registration revoked) and refuse the create. (A
		// region dropped as broken ends its holds the same way.)
		why := fmt.Errorf("hold %s: %w: engine %s went away while the hold was made", m.ID, lease.ErrEngineGone, r.Engine)
		if err := r.CheckBroken(); err != nil {
			why = fmt.Errorf("hold %s: %w", m.ID, err)
		}
		a.step(ctx, lease.EngineGoneEvent{Now: a.now()}, func() Reply { return Reply{Err: why} })
		return
	}
	a.rearm()
	l := r.Region.Layout
	ctx.Respond(Reply{Create: &messages.CreateHoldReply{
		Params: &messages.KVTransferParams{
			DoRemoteDecode:  true,
			TransferId:      m.ID,
			RemoteCtrl:      a.deps.Ctrl,
			RemoteEngineId:  r.Engine,
			RemoteBlockIds:  m.Req.BlockIds,
			RemoteNumTokens: m.Req.NumTokens,
			TpSize:          l.TPSize,
			BlockSize:       l.BlockSize,
			RetainS:         uint32(m.Lease.Retain / time.Second),
		},
		ExpiresUnixMs: h.Status().Deadline.UnixMilli(),
	}})
}

func (a *holdActor) startRead(ctx actor.Context, m *StartRead) {
	l := a.spec.region.Region.Layout
	if _, err := kvmem.Compatible(l, m.Layout); err != nil {
		ctx.Respond(Reply{Err: fmt.Errorf("pull %s of %s: %w", m.PullID, a.id(), err)})
		return
	}
	if err := a.brokenRegion(); err != nil {
		ctx.Respond(Reply{Err: fmt.Errorf("pull %s of %s: %w", m.PullID, a.id(), err)})
		return
	}
	if m.Request != "" && a.h != nil {
		// The caller binds the hold to the request first (askBound).
		if st := a.h.Status(); st.Consumer != m.By || st.Request != m.Request {
			ctx.Respond(Reply{Unbound: true})
			return
		}
	}
	now := a.now()
	// A reader may not pin the blocks past the lease it renews: its
	// deadline is at most one lease away.
	timeout := min(m.Timeout, a.h.Retain())
	a.step(ctx, lease.PullStart{Now: now, By: m.By, PullID: m.PullID, Deadline: now.Add(timeout + a.deps.ReadSlack)}, func() Reply {
		st := a.h.Status()
		return Reply{Desc: &messages.Descriptors{
			TransferId:        a.id(),
			RemoteCtrl:        a.deps.Ctrl,
			Layout:            LayoutToProto(l),
			BlockIds:          a.spec.blocks,
			Rkeys:             a.remoteKeys(),
			Segments:          a.segments(),
			ExpiresUnixMs:     st.Deadline.UnixMilli(),
			ImpliedSegments:   a.implied,
			RegionAddr:        a.regionAddr,
			PullEndAsync:      st.Mode != lease.AfterPull,
			HolderIncarnation: a.incarnation(),
			MoreRanks:         a.more.descriptors(),
		}}
	})
}

func (a *holdActor) incarnation() string {
	if a.deps.Incarnation == nil {
		return ""
	}
	return a.deps.Incarnation()
}

// stopping runs in Stopping, whatever stops the actor: its own linger
// after the end, a failed creation, or a panic (the supervisor stops it,
// never restarts it). A hold that had not ended yet is aborted through the
// lease, so its blocks go back once, with the engine told "aborted"; a
// creation that died before the lease existed gives back what it took,
// telling nobody (the engine never got the params).
func (a *holdActor) stopping(ctx actor.Context) {
	defer func() {
		// A panic here would leave protoactor's stop unfinished (no
		// Stopped: the region references never go back).
		if r := recover(); r != nil {
			a.deps.Log.Error("hold actor panicked while stopping", "transfer", a.id(), "panic", r)
		}
	}()
	if a.deregistering {
		// Revoking the registrations panicked midway: a reader may still
		// see one, so the blocks stay held for good, as for a failed
		// revocation.
		a.deregistering, a.quarantined = false, true
		a.deps.Log.Error("deregister panicked: the hold's blocks stay held for good", "transfer", a.id())
	}
	if len(a.pending) > 0 || a.freeing != nil {
		// A panic cut the lease's last step short (the lease has moved
		// on, an Abort may do nothing): carry out the rest.
		a.deps.Log.Warn("hold stopped while carrying out its lease's step; finishing it", "transfer", a.id())
		a.finishFree()
		a.applyPending()
	}
	switch {
	case a.h != nil:
		if !a.h.Status().State.Terminal() {
			a.deps.Log.Warn("hold stopped before it was freed; freeing now", "transfer", a.id())
		}
		a.step(ctx, lease.Abort{Now: a.now()}, nil)
	case a.held:
		a.unholdAll()
		a.held = false
	}
	a.deregister()
	a.deps.timers().cancel(&a.wake)
	if a.linger != nil {
		a.linger.Stop()
	}
}

// step feeds ev to the state machine, performs the effects, re-arms the
// timer and, if ok is set, responds with ok() or the error. The effects are
// done and the timer armed before the answer goes, so whoever gets the
// answer may count on them.
func (a *holdActor) step(ctx actor.Context, ev lease.Event, ok func() Reply) {
	if a.h == nil {
		if ok != nil {
			ctx.Respond(Reply{Err: errors.New("hold not initialised")})
		}
		return
	}
	fx, err := a.h.Step(ev)
	if a.entry != nil {
		a.entry.State.Store(int32(a.h.Status().State))
	}
	a.pending = append(a.pending, fx...)
	a.applyPending()
	a.rearm()
	if ok != nil {
		var rep Reply
		if err != nil {
			rep = Reply{Err: fmt.Errorf("transfer %s: %w", a.id(), err)}
		} else {
			rep = ok()
		}
		if rep.Status == nil && rep.Desc == nil && rep.Err == nil {
			rep.Status = a.status()
		}
		ctx.Respond(rep)
	}
}

// applyPending applies the lease's effects in order, each taken off the
// list before it runs (one that panics is not run again).
func (a *holdActor) applyPending() {
	for len(a.pending) > 0 {
		e := a.pending[0]
		a.pending = a.pending[1:]
		a.apply(e)
	}
}

// apply performs one effect of the lease.
func (a *holdActor) apply(e lease.Effect) {
	switch e := e.(type) {
	case lease.BeginRead:
		a.regions(func(m *kvmem.Mapped) {
			if err := m.Blocks.BeginRead(a.spec.blocks); err != nil {
				a.deps.Log.Warn("block accounting refused a read mark", "transfer", a.id(), "pull", e.PullID, "region", m.ID, "err", err)
			}
		})
	case lease.EndRead:
		a.regions(func(m *kvmem.Mapped) { m.Blocks.EndRead(a.spec.blocks) })
	case lease.Deregister:
		a.deregistering = true
		a.deregister()
		a.deregistering = false
	case lease.Free:
		a.free(e)
	case lease.PullAbandoned:
		a.deps.Metrics.PullsAbandoned.Add(1)
		a.deps.Log.Warn("pull abandoned: reader passed its deadline without reporting", "transfer", a.id(), "pull", e.PullID)
	}
}

// deregister revokes the hold's registrations (idempotent: none are left
// after the first call).
//
// A registration the data plane could not revoke (UCX left the memory
// registered: replies still in flight to a reader that stopped answering)
// may still be read, so the hold's blocks must never go back to the engine,
// which would write the next prompt's KV where that reader can see it: the
// hold is quarantined (free keeps its blocks held, and tells no one).
func (a *holdActor) deregister() {
	if err := errors.Join(a.deregisterAll(), a.more.deregister()); err != nil {
		a.quarantined = true
		a.deps.Log.Error("deregister failed: the hold's blocks stay held for good, never given back to the engine (a reader may still see them)",
			"transfer", a.id(), "blocks", len(a.spec.blocks), "err", err)
	}
}

// unholdAll gives the hold's blocks back in every rank's accounting,
// reporting the first refusal (a double free).
func (a *holdActor) unholdAll() error {
	var first error
	a.regions(func(m *kvmem.Mapped) {
		if err := m.Blocks.Unhold(a.spec.blocks); err != nil && first == nil {
			first = err
		}
	})
	return first
}

// freeSteps is a lease.Free being carried out: each step is marked done
// once it returned, so that finishing it again (stopping, after a panic
// midway) does each at most once more — a notice perhaps twice, which
// engines tolerate, the blocks never.
type freeSteps struct {
	f                       lease.Free
	unheld, notified, inDir bool
}

// free performs lease.Free, which the lease emits once, after Deregister:
// the blocks go back to the accounting, the engine is told (unless it is
// gone), the directory keeps a tombstone, and the actor lingers, then stops.
func (a *holdActor) free(f lease.Free) {
	a.freeing = &freeSteps{f: f}
	a.finishFree()
	// Linger before stopping: a request that looked the hold up just before
	// it ended is already on its way to this mailbox, and protoactor drops
	// messages queued behind a stop without answering. While lingering the
	// terminal state machine answers them with expired/released codes; new
	// lookups find the directory's tombstone instead.
	self, sys := a.wake.pid, a.deps.timers().system()
	if self != nil {
		a.linger = a.deps.clock().AfterFunc(lingerAfterFree, func() { sys.Root.Stop(self) })
	}
}

// finishFree does the steps of a.freeing not done yet.
func (a *holdActor) finishFree() {
	fs := a.freeing
	if fs == nil {
		return
	}
	if !fs.unheld {
		if a.quarantined {
			a.deps.Metrics.HoldsQuarantined.Add(1)
			fs.f.Notify = false
		} else if err := a.unholdAll(); err != nil {
			a.deps.Metrics.DoubleFrees.Add(1)
			a.deps.Log.Error("block accounting refused a free: double free prevented", "transfer", a.id(), "err", err)
		}
		a.deps.Metrics.HoldsFreed.Add(1)
		fs.unheld = true
	}
	if fs.f.Notify && !fs.notified {
		a.deps.Notify(&messages.BlocksFreed{
			TransferId: a.id(), EngineId: a.spec.region.Engine, RegionId: a.spec.region.ID,
			BlockIds: a.spec.blocks, Reason: fs.f.Reason.String(),
		})
		fs.notified = true
	}
	if !fs.inDir {
		if a.quarantined {
			// Its blocks stay held for good: the entry stays too, so that
			// engine.state lists the hold and an engine rebuilding its
			// holds from it (lost notices) never takes the blocks back.
			if a.entry != nil {
				a.entry.Quarantined.Store(true)
			}
		} else {
			a.deps.Dir.end(a.id(), fs.f.Reason)
		}
		fs.inDir = true
	}
	a.freeing = nil
}

// lingerAfterFree is how long an ended hold actor keeps answering before it
// stops; longer than any in-flight ask to it can take to arrive.
const lingerAfterFree = 2 * time.Second

// rearm schedules the lease's next wake-up; none once it ended.
func (a *holdActor) rearm() {
	if a.h == nil || a.wake.pid == nil {
		return
	}
	at, ok := a.h.NextWake()
	if !ok {
		a.deps.timers().cancel(&a.wake)
		return
	}
	a.deps.timers().schedule(&a.wake, at)
}

func (a *holdActor) status() *messages.HoldStatus {
	st := a.h.Status()
	state := st.State.String()
	if a.quarantined {
		// Its lease ran Free, but its blocks stay held for good: never
		// read as freed (an engine rebuilding its holds would take them).
		state, st.Freed = "quarantined", false
	}
	return &messages.HoldStatus{
		TransferId:    a.id(),
		State:         state,
		EngineId:      a.spec.region.Engine,
		RegionId:      a.spec.region.ID,
		BlockIds:      a.spec.blocks,
		ActivePulls:   uint32(st.ActivePulls),
		PullsDone:     uint32(st.PullsDone),
		ExpiresUnixMs: st.Deadline.UnixMilli(),
		Release:       st.Mode.String(),
		Freed:         st.Freed,
		CreatedUnixMs: a.entry.Created.UnixMilli(),
		Bytes:         a.entry.Bytes,
	}
}

// LayoutToProto converts a layout to its wire form.
func LayoutToProto(l kvmem.Layout) *messages.Layout {
	return &messages.Layout{NumLayers: l.Layers, KvPlanes: l.Planes, NumBlocks: l.Blocks, BlockBytes: l.BlockBytes, BlockSize: l.BlockSize, TpSize: l.TPSize,
		TpRank: l.TPRank, KvOrder: l.Order, NumKvHeads: l.Heads, HeadSize: l.HeadSize, Dtype: l.Dtype, Model: l.Model}
}

// LayoutFromProto converts a wire layout; a nil one is the zero layout
// (which Validate rejects).
func LayoutFromProto(m *messages.Layout) kvmem.Layout {
	if m == nil {
		return kvmem.Layout{}
	}
	return kvmem.Layout{Layers: m.NumLayers, Planes: m.KvPlanes, Blocks: m.NumBlocks, BlockBytes: m.BlockBytes, BlockSize: m.BlockSize, TPSize: m.TpSize,
		TPRank: m.TpRank, Order: m.KvOrder, Heads: m.NumKvHeads, HeadSize: m.HeadSize, Dtype: m.Dtype, Model: m.Model}
}
