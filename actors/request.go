package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// RequestDeps is what request actors need from their daemon.
type RequestDeps struct {
	Store requests.Store
	NC    *nats.Conn
	Self  string // this member's id: the owner written into states
	// Clock reads the time and runs the keep-alive timer; nil is the
	// system clock.
	Clock   clock.Clock
	Log     *slog.Logger
	Publish func(subject string, m proto.Message)
	Table   *RequestTable
	// StoreTimeout bounds one durable write.
	StoreTimeout time.Duration
	// LoadFailurePolicy is the member's kv_load_failure_policy, told to an
	// engine whose request lost its hold (HoldLostNotice).
	LoadFailurePolicy string
	// Metrics, if set, counts takeovers, adoptions, fences and lost holds.
	Metrics *Metrics
}

// unused absorbs the counts of RequestDeps without Metrics.
var unused Metrics

func (d *RequestDeps) clock() clock.Clock { return clock.Or(d.Clock) }

func (d *RequestDeps) metrics() *Metrics {
	if d.Metrics == nil {
		return &unused
	}
	return d.Metrics
}

// RequestTable maps request ids to the live request actors of this member.
type RequestTable struct {
	mu   sync.RWMutex
	live map[string]*actor.PID
}

// NewRequestTable returns an empty table.
func NewRequestTable() *RequestTable { return &RequestTable{live: map[string]*actor.PID{}} }

// Lookup returns the actor of a request hosted here.
func (t *RequestTable) Lookup(id string) (*actor.PID, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	p, ok := t.live[id]
	return p, ok
}

// Len is the number of requests hosted here (the member's load).
func (t *RequestTable) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.live)
}

// All returns the actors of every request hosted here.
func (t *RequestTable) All() []*actor.PID {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]*actor.PID, 0, len(t.live))
	for _, p := range t.live {
		out = append(out, p)
	}
	return out
}

// claim reserves id for pid; false if another actor has it.
func (t *RequestTable) claim(id string, pid *actor.PID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.live[id]; ok {
		return false
	}
	t.live[id] = pid
	return true
}

func (t *RequestTable) drop(id string, pid *actor.PID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.live[id]; ok && p.Equal(pid) {
		delete(t.live, id)
	}
}

// StartRequest makes a new request actor create its state. Instance is the
// engine's registered instance id (see EngineLost). Reply: Status or Err.
type StartRequest struct {
	Msg      *messages.StartRequestMsg
	Instance string
}

// TakeoverRequest moves a request that runs here to another local engine
// with the next epoch (a router-decided resume landing on the same member).
// Reply: Status or Err.
type TakeoverRequest struct {
	Msg      *messages.StartRequestMsg
	Instance string
}

// AdoptRequest makes a new request actor take over an orphan. Reply: Status or Err.
type AdoptRequest struct {
	ID        string
	DeadOwner string
	Engine    string // local decode engine that will resume it
}

// RequestProgress appends tokens. Reply: Status or Err.
type RequestProgress struct {
	Epoch  uint64
	Tokens []uint32
}

// FinishRequest ends the request. Reply: Status or Err.
type FinishRequest struct{ Epoch uint64 }

// EngineLost tells every request actor that a local engine went away
// (engine.gone, or its registration lapsed). A request of that engine that
// no other activation took over ends: nobody can continue it here (the
// coordinator resumes requests of dead members, not of dead engines on a
// live member), and if the router resumes it elsewhere the takeover comes
// first.
// Its hold is released and its state deleted. Instance, if set, limits it
// to requests started by that instance of the engine (a restarted engine's
// new requests carry on). No reply.
type EngineLost struct{ Engine, Instance string }

// InspectRequest asks for the state. Reply: Status.
type InspectRequest struct{}

type renewTick struct{}

// RequestReply is a request actor's answer.
type RequestReply struct {
	Status *messages.RequestStatus
	Err    error
}

type requestActor struct {
	deps     *RequestDeps
	instance string // the engine instance that runs the request here
	st       *messages.RequestState
	rev      uint64
	timer    clock.Timer
	// holdLost is set once the holder answered that the hold is gone: the
	// engine was told, and nothing renews or releases it any more.
	holdLost bool
	self     *actor.PID
	system   *actor.ActorSystem
}

// RequestProps returns props for one request actor.
func RequestProps(deps *RequestDeps) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &requestActor{deps: deps} })
}

func (a *requestActor) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), a.deps.StoreTimeout)
}

func (a *requestActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *StartRequest:
		a.start(ctx, m)
	case *AdoptRequest:
		a.adopt(ctx, m)
	case *TakeoverRequest:
		a.takeoverInPlace(ctx, m)
	case *RequestProgress:
		next, err := requests.Append(a.st, m.Epoch, m.Tokens, a.deps.clock().Now())
		if err != nil {
			ctx.Respond(RequestReply{Err: err})
			return
		}
		a.write(ctx, next)
	case *FinishRequest:
		a.finish(ctx, m)
	case *InspectRequest:
		ctx.Respond(RequestReply{Status: a.status("running")})
	case *EngineLost:
		a.engineLost(ctx, m)
	case renewTick:
		if a.fencedInStore(ctx) {
			return
		}
		a.renewHold()
		a.arm()
	case *actor.Stopping:
		if a.timer != nil {
			a.timer.Stop()
		}
		if a.st != nil {
			a.deps.Table.drop(a.st.RequestId, ctx.Self())
		}
	}
}

func (a *requestActor) status(s string) *messages.RequestStatus {
	return &messages.RequestStatus{State: a.st, Status: s}
}

func (a *requestActor) fail(ctx actor.Context, err error) {
	ctx.Respond(RequestReply{Err: err})
	ctx.Stop(ctx.Self())
}

func (a *requestActor) start(ctx actor.Context, m *StartRequest) {
	st, err := requests.New(m.Msg, a.deps.Self, a.deps.clock().Now())
	if err != nil {
		a.fail(ctx, err)
		return
	}
	if !a.deps.Table.claim(st.RequestId, ctx.Self()) {
		a.fail(ctx, fmt.Errorf("%w: %s runs here", requests.ErrExists, st.RequestId))
		return
	}
	a.st, a.instance = st, m.Instance
	c, cancel := a.ctx()
	defer cancel()
	if m.Msg.Takeover {
		st, err = a.takeover(c, m.Msg)
	} else {
		a.rev, err = a.deps.Store.Create(c, st)
	}
	if err != nil {
		a.fail(ctx, err)
		return
	}
	a.st = st
	a.self, a.system = ctx.Self(), ctx.ActorSystem()
	// The first renewal, now, names the request: its holder binds the hold
	// to this engine (the request's state says so), and from then on serves
	// nobody else. A takeover moves the binding the same way, before it
	// answers (the engine pulls next); a new request answers first, so that
	// a slow holder does not delay its start (until bound, the hold serves
	// whoever has its transfer id, as before).
	if m.Msg.Takeover {
		a.renewHold()
	}
	a.arm()
	ctx.Respond(RequestReply{Status: a.status("running")})
	if !m.Msg.Takeover {
		a.renewHold()
	}
}

// takeover moves the stored request here with the next epoch, or creates it
// if it is not stored (its first activation never started, or it ended). A
// write of the old owner racing ours makes the CAS fail: read again, retry.
func (a *requestActor) takeover(c context.Context, start *messages.StartRequestMsg) (*messages.RequestState, error) {
	for attempt := 0; ; attempt++ {
		cur, rev, err := a.deps.Store.Get(c, start.RequestId)
		if errors.Is(err, requests.ErrNotFound) {
			st, err := requests.New(start, a.deps.Self, a.deps.clock().Now())
			if err != nil {
				return nil, err
			}
			if a.rev, err = a.deps.Store.Create(c, st); err == nil || attempt >= 3 {
				return st, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		next, err := requests.Takeover(cur, start, a.deps.Self, a.deps.clock().Now())
		if err != nil {
			return nil, err
		}
		if a.rev, err = a.deps.Store.Update(c, next, rev); err == nil {
			a.deps.Log.Info("request taken over", "request", start.RequestId, "from", cur.Owner, "engine", start.EngineId, "epoch", next.Epoch)
			a.deps.metrics().TakenOver.Add(1)
			return next, nil
		}
		if !errors.Is(err, requests.ErrFenced) || attempt >= 3 {
			return nil, err
		}
	}
}

// takeoverInPlace moves a request that runs here to the engine a
// router-decided resume names, fencing the engine that ran it.
func (a *requestActor) takeoverInPlace(ctx actor.Context, m *TakeoverRequest) {
	next, err := requests.Takeover(a.st, m.Msg, a.deps.Self, a.deps.clock().Now())
	if err != nil {
		ctx.Respond(RequestReply{Err: err})
		return
	}
	old := a.st
	c, cancel := a.ctx()
	defer cancel()
	rev, err := a.deps.Store.Update(c, next, a.rev)
	if err != nil {
		a.fail(ctx, fmt.Errorf("takeover of request %s: %w", old.RequestId, err))
		return
	}
	a.st, a.rev, a.instance = next, rev, m.Instance
	a.deps.Publish(api.FencedSubject(old.EngineId), &messages.FencedNotice{RequestId: old.RequestId, StaleEpoch: old.Epoch, NewOwner: a.deps.Self})
	a.deps.metrics().TakenOver.Add(1)
	a.deps.metrics().Fenced.Add(1)
	a.renewHold()
	a.arm()
	ctx.Respond(RequestReply{Status: a.status("running")})
}

// noticeFenced tells the request's engine that this activation is fenced,
// naming the member that owns the request now. The owner is read in the
// background, so that the write that found the fence answers at once: a
// store that has just said "fenced" can be recovering from the partition
// that caused it (JetStream answers "temporarily unavailable" for a moment
// after a partition heals, and a deposed leader may still answer a read with
// the state from before). The notice goes out when the owner is known, or
// with no owner after a few seconds of trying.
func (a *requestActor) noticeFenced() {
	id, engine, epoch, self := a.st.RequestId, a.st.EngineId, a.st.Epoch, a.st.Owner
	store, log, publish, timeout, clk := a.deps.Store, a.deps.Log, a.deps.Publish, a.deps.StoreTimeout, a.deps.clock()
	go func() {
		owner := ""
		deadline := clk.Now().Add(2 * timeout)
		for attempt := 1; ; attempt++ {
			c, cancel := context.WithTimeout(context.Background(), time.Second)
			cur, _, err := store.Get(c, id)
			cancel()
			// The write was refused, so the state moved on: a read that
			// shows it as this activation left it comes from a server that
			// has not heard yet (a stream leader deposed by the partition
			// that caused the fence answers for a moment after the heal).
			if err == nil && cur.Owner == self && cur.Epoch == epoch {
				err = fmt.Errorf("read the request as it was before the fence (a stale server)")
			}
			if err == nil {
				owner = cur.Owner
				break
			}
			if errors.Is(err, requests.ErrNotFound) || clk.Now().After(deadline) {
				log.Debug("the owner of a fenced request is unknown", "request", id, "attempts", attempt, "err", err)
				break
			}
			_, wait := clk.NewTimer(200 * time.Millisecond)
			<-wait
		}
		log.Warn("request fenced: it moved to another member", "request", id, "epoch", epoch, "new_owner", owner)
		publish(api.FencedSubject(engine), &messages.FencedNotice{RequestId: id, StaleEpoch: epoch, NewOwner: owner})
	}()
}

// fencedInStore reports (and acts on) a request that another activation
// took over while this one was idle: its engine is told, the actor stops,
// and it no longer keeps the hold alive.
func (a *requestActor) fencedInStore(ctx actor.Context) bool {
	c, cancel := a.ctx()
	defer cancel()
	cur, _, err := a.deps.Store.Get(c, a.st.RequestId)
	switch {
	case errors.Is(err, requests.ErrNotFound):
		a.deps.Log.Info("request ended elsewhere; this activation stops", "request", a.st.RequestId, "epoch", a.st.Epoch)
	case err != nil:
		return false // the store is unreachable: keep the hold alive meanwhile
	case cur.Epoch == a.st.Epoch && cur.Owner == a.st.Owner:
		return false
	default:
		a.deps.Log.Warn("request fenced: it moved to another member", "request", a.st.RequestId, "epoch", a.st.Epoch, "new_owner", cur.Owner)
		a.deps.Publish(api.FencedSubject(a.st.EngineId), &messages.FencedNotice{RequestId: a.st.RequestId, StaleEpoch: a.st.Epoch, NewOwner: cur.Owner})
		a.deps.metrics().Fenced.Add(1)
	}
	ctx.Stop(ctx.Self())
	return true
}

func (a *requestActor) adopt(ctx actor.Context, m *AdoptRequest) {
	if !a.deps.Table.claim(m.ID, ctx.Self()) {
		a.fail(ctx, fmt.Errorf("%w: %s already runs here", requests.ErrExists, m.ID))
		return
	}
	a.st = &messages.RequestState{RequestId: m.ID}
	c, cancel := a.ctx()
	defer cancel()
	st, rev, err := a.deps.Store.Get(c, m.ID)
	if err != nil {
		a.fail(ctx, err)
		return
	}
	next, err := requests.Adopt(st, m.DeadOwner, a.deps.Self, m.Engine, a.deps.clock().Now())
	if err != nil {
		a.fail(ctx, err)
		return
	}
	if a.rev, err = a.deps.Store.Update(c, next, rev); err != nil {
		a.fail(ctx, err)
		return
	}
	a.st = next
	a.self, a.system = ctx.Self(), ctx.ActorSystem()
	a.renewHold()
	a.arm()
	a.deps.Publish(api.ResumeSubject(next.EngineId), &messages.ResumeNotice{State: next})
	a.deps.Log.Info("request adopted", "request", m.ID, "from", m.DeadOwner, "epoch", next.Epoch, "engine", next.EngineId)
	a.deps.metrics().Adopted.Add(1)
	ctx.Respond(RequestReply{Status: a.status("running")})
}

// write checkpoints next with compare-and-set. A conflict means another
// member adopted the request while we were unreachable: we are a zombie,
// fenced, and stop.
func (a *requestActor) write(ctx actor.Context, next *messages.RequestState) {
	c, cancel := a.ctx()
	defer cancel()
	rev, err := a.deps.Store.Update(c, next, a.rev)
	if errors.Is(err, requests.ErrFenced) {
		a.noticeFenced()
		a.deps.metrics().Fenced.Add(1)
		a.fail(ctx, fmt.Errorf("request %s: %w", a.st.RequestId, err))
		return
	}
	if err != nil {
		ctx.Respond(RequestReply{Err: err})
		return
	}
	a.st, a.rev = next, rev
	ctx.Respond(RequestReply{Status: a.status("running")})
}

func (a *requestActor) finish(ctx actor.Context, m *FinishRequest) {
	if m.Epoch != a.st.Epoch {
		ctx.Respond(RequestReply{Err: fmt.Errorf("%w: epoch %d, current %d", requests.ErrFenced, m.Epoch, a.st.Epoch)})
		return
	}
	c, cancel := a.ctx()
	defer cancel()
	if err := a.deps.Store.Delete(c, a.st.RequestId, a.rev); err != nil {
		// A conflict here is a fence too; don't release someone else's hold.
		a.fail(ctx, fmt.Errorf("%w: %v", requests.ErrFenced, err))
		return
	}
	a.releaseHold()
	ctx.Respond(RequestReply{Status: a.status("finished")})
	ctx.Stop(ctx.Self())
}

func (a *requestActor) engineLost(ctx actor.Context, m *EngineLost) {
	if a.st == nil || a.st.EngineId != m.Engine || (m.Instance != "" && m.Instance != a.instance) {
		return
	}
	c, cancel := a.ctx()
	defer cancel()
	if err := a.deps.Store.Delete(c, a.st.RequestId, a.rev); err != nil {
		// Taken over (the router resumed it elsewhere): not ours to release.
		a.deps.Log.Info("request's engine went away; it runs elsewhere now", "request", a.st.RequestId, "engine", m.Engine, "err", err)
		ctx.Stop(ctx.Self())
		return
	}
	a.deps.Log.Warn("request's engine went away and nobody took it over: releasing its hold", "request", a.st.RequestId, "engine", m.Engine, "transfer", a.st.Params.GetTransferId())
	a.releaseHold()
	ctx.Stop(ctx.Self())
}

func (a *requestActor) holder() *api.Client {
	return &api.Client{NC: a.deps.NC, Member: a.st.Params.GetRemoteCtrl().GetMember()}
}

func (a *requestActor) renewHold() {
	if a.holdLost {
		return
	}
	c, cancel := a.ctx()
	defer cancel()
	_, err := a.holder().Renew(c, &messages.HoldRef{TransferId: a.st.Params.GetTransferId(), Requester: a.st.EngineId, RequestId: a.st.RequestId})
	if err == nil {
		return
	}
	switch code := api.CodeOf(err); code {
	case api.CodeUnknownTransfer, api.CodeExpired, api.CodeReleased, api.CodeEngineGone:
		// For good: tell the engine once, and stop renewing.
		a.holdLost = true
		a.deps.metrics().HoldsLost.Add(1)
		a.deps.Log.Warn("the request's hold is gone; a resume cannot pull it", "request", a.st.RequestId, "transfer", a.st.Params.GetTransferId(),
			"holder", a.st.Params.GetRemoteCtrl().GetMember(), "code", code.Name(), "policy", a.deps.LoadFailurePolicy)
		a.deps.Publish(api.HoldLostSubject(a.st.EngineId), &messages.HoldLostNotice{
			RequestId: a.st.RequestId, Epoch: a.st.Epoch, TransferId: a.st.Params.GetTransferId(), Holder: a.st.Params.GetRemoteCtrl().GetMember(),
			ErrorCode: uint32(code), Reason: code.Name(), KvLoadFailurePolicy: a.deps.LoadFailurePolicy,
		})
	default:
		// The holder is unreachable or slow: try again next period.
		a.deps.Log.Warn("keep-alive of the request's hold failed", "request", a.st.RequestId, "transfer", a.st.Params.GetTransferId(), "err", err)
	}
}

func (a *requestActor) releaseHold() {
	if a.holdLost {
		return
	}
	c, cancel := a.ctx()
	defer cancel()
	if _, err := a.holder().Release(c, &messages.HoldRef{TransferId: a.st.Params.GetTransferId(), Requester: a.st.EngineId, RequestId: a.st.RequestId}); err != nil {
		a.deps.Log.Warn("release of the request's hold failed; it will expire", "request", a.st.RequestId, "err", err)
	}
}

// arm schedules the next keep-alive at a third of the hold's lease.
func (a *requestActor) arm() {
	if a.timer != nil {
		a.timer.Stop()
	}
	every := time.Duration(a.st.Params.GetRetainS()) * time.Second / 3
	if every <= 0 {
		every = 20 * time.Second
	}
	self, sys := a.self, a.system
	a.timer = a.deps.clock().AfterFunc(every, func() { sys.Root.Send(self, renewTick{}) })
}
