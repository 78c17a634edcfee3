package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
	"github.com/connex/connex/requests/activation"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// RequestDeps is what request actors need from their daemon.
type RequestDeps struct {
	Store requests.Store
	NC    *nats.Conn
	// Holds, if set, renews and releases the requests' holds; nil is the
	// holders' NATS API over NC.
	Holds HoldCalls
	Self  string // this member's id: the owner written into states
	// Clock reads the time and runs the keep-alive timer; nil is the
	// system clock.
	Clock   clock.Clock
	Log     *slog.Logger
	Publish func(subject string, m proto.Message)
	Table   *RequestTable
	// StoreTimeout bounds one durable write, and one call to a holder.
	StoreTimeout time.Duration
	// LoadFailurePolicy is the member's kv_load_failure_policy, told to an
	// engine whose request lost its hold (HoldLostNotice).
	LoadFailurePolicy string
	// Metrics, if set, counts takeovers, adoptions, fences and lost holds.
	Metrics *Metrics
	// PromptRefresh is the age at which a write of a request's record
	// stores its prompt again (request_ttl_s / requests.PromptRefreshDiv;
	// activation.RefreshPrompt); 0: only when the prompt changed.
	PromptRefresh time.Duration
}

// HoldCalls are the calls a request makes on its hold's holder (the
// holders' NATS API: hold.renew, hold.release). Errors carry the API's
// codes (api.CodeOf).
type HoldCalls interface {
	Renew(ctx context.Context, holder string, ref *messages.HoldRef) error
	Release(ctx context.Context, holder string, ref *messages.HoldRef) error
}

// natsHolds is HoldCalls over the NATS API.
type natsHolds struct{ nc *nats.Conn }

func (h natsHolds) Renew(ctx context.Context, holder string, ref *messages.HoldRef) error {
	_, err := (&api.Client{NC: h.nc, Member: holder}).Renew(ctx, ref)
	return err
}

func (h natsHolds) Release(ctx context.Context, holder string, ref *messages.HoldRef) error {
	_, err := (&api.Client{NC: h.nc, Member: holder}).Release(ctx, ref)
	return err
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

func (d *RequestDeps) holds() HoldCalls {
	if d.Holds == nil {
		return natsHolds{nc: d.NC}
	}
	return d.Holds
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

// GrantRequest makes a new request actor move request ID to local engine
// Engine (its registered instance Instance) on the router's grant, ahead of
// the engine's takeover, which then confirms it (activation.Grant). Reply:
// Status "granted", or Err when it could not (the actor then waits, idle,
// for the engine's takeover to start it as without the grant).
type GrantRequest struct {
	ID, Engine, Instance string
	TTL                  time.Duration // the grant's lifetime (requests.GrantLifetime)
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

// InspectRequest asks for the state. Reply: Status (at once, even while a
// write is in flight).
type InspectRequest struct{}

type renewTick struct{}

// requestIODone carries the result of an effect's I/O, run off the
// mailbox, back to it.
type requestIODone struct{ ev activation.Event }

// RequestReply is a request actor's answer.
type RequestReply struct {
	Status *messages.RequestStatus
	Err    error
}

// requestActor applies the effects of its activation.Activation, which
// decides: it keeps the callers waiting for an answer, runs the store's
// and the holder's I/O on goroutines that report back as messages (one at
// a time: the activation asks for one, and queues calls behind it), arms
// the keep-alive timer, publishes notices and stops.
type requestActor struct {
	deps   *RequestDeps
	core   *activation.Activation
	calls  map[uint64]*actor.PID // callers waiting, by the call ids given to the core
	next   uint64
	timer  clock.Timer
	self   *actor.PID
	system *actor.ActorSystem
}

// RequestProps returns props for one request actor.
func RequestProps(deps *RequestDeps) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &requestActor{deps: deps, core: activation.New(deps.Self).RefreshPrompt(deps.PromptRefresh), calls: map[uint64]*actor.PID{}}
	})
}

func (a *requestActor) now() time.Time { return a.deps.clock().Now() }

func (a *requestActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		a.self, a.system = ctx.Self(), ctx.ActorSystem()
	case *StartRequest:
		a.step(ctx, activation.Start{Now: a.now(), Call: a.call(ctx), Msg: m.Msg, Instance: m.Instance})
	case *AdoptRequest:
		a.step(ctx, activation.Adopt{Now: a.now(), Call: a.call(ctx), ID: m.ID, DeadOwner: m.DeadOwner, Engine: m.Engine})
	case *TakeoverRequest:
		a.step(ctx, activation.Takeover{Now: a.now(), Call: a.call(ctx), Msg: m.Msg, Instance: m.Instance})
	case *GrantRequest:
		a.step(ctx, activation.Grant{Now: a.now(), Call: a.call(ctx), ID: m.ID, Engine: m.Engine, Instance: m.Instance, TTL: m.TTL})
	case *RequestProgress:
		a.step(ctx, activation.Progress{Now: a.now(), Call: a.call(ctx), Epoch: m.Epoch, Tokens: m.Tokens})
	case *FinishRequest:
		a.step(ctx, activation.Finish{Now: a.now(), Call: a.call(ctx), Epoch: m.Epoch})
	case *InspectRequest:
		a.step(ctx, activation.Inspect{Now: a.now(), Call: a.call(ctx)})
	case *EngineLost:
		a.step(ctx, activation.EngineLost{Now: a.now(), Engine: m.Engine, Instance: m.Instance})
	case renewTick:
		a.step(ctx, activation.RenewTick{Now: a.now()})
	case requestIODone:
		a.step(ctx, m.ev)
	case *actor.Stopping:
		if a.timer != nil {
			a.timer.Stop()
		}
		a.leave(ctx)
	}
}

// call registers the sender of the current message as a caller waiting
// for a Reply; 0 when nobody waits.
func (a *requestActor) call(ctx actor.Context) uint64 {
	if ctx.Sender() == nil {
		return 0
	}
	a.next++
	a.calls[a.next] = ctx.Sender()
	return a.next
}

// step feeds ev to the activation and applies its effects in order.
func (a *requestActor) step(ctx actor.Context, ev activation.Event) {
	fx, err := a.core.Step(ev)
	if err != nil {
		a.deps.Log.Debug("request actor: a result nobody waited for", "request", a.core.ID(), "err", err)
	}
	for _, e := range fx {
		if _, ok := e.(activation.Stop); ok {
			// Out of the table before any answer of this step is sent: a
			// caller told "finished" finds the member's slot free (and the
			// id startable again) at once, not after the actor's Stopping.
			a.leave(ctx)
		}
	}
	for _, e := range fx {
		a.apply(ctx, e)
	}
}

// leave takes this actor's request out of the member's table.
func (a *requestActor) leave(ctx actor.Context) {
	if id := a.core.ID(); id != "" {
		a.deps.Table.drop(id, ctx.Self())
	}
}

// apply performs one effect; its I/O runs on a goroutine of its own that
// reports back as a requestIODone.
func (a *requestActor) apply(ctx actor.Context, e activation.Effect) {
	switch e := e.(type) {
	case activation.Claim:
		a.step(ctx, activation.Claimed{Now: a.now(), OK: a.deps.Table.claim(e.ID, ctx.Self())})
	case activation.Load:
		a.io(func(c context.Context) activation.Event {
			get := a.deps.Store.Head
			if e.Whole {
				get = a.deps.Store.Get
			}
			st, rev, err := get(c, e.ID)
			return activation.Loaded{Now: a.now(), State: st, Rev: rev, Err: err}
		})
	case activation.Write:
		a.io(func(c context.Context) activation.Event {
			var rev uint64
			var err error
			switch e.Op {
			case activation.Create:
				rev, err = a.deps.Store.Create(c, e.State)
			case activation.Update:
				rev, err = a.deps.Store.Update(c, e.State, e.Rev, e.Prompt)
			case activation.Delete:
				err = a.deps.Store.Delete(c, e.ID, e.Rev)
			}
			return activation.Written{Now: a.now(), Rev: rev, Err: err}
		})
	case activation.Renew:
		a.io(func(c context.Context) activation.Event { return a.renew(c, e.Hold) })
	case activation.Release:
		a.io(func(c context.Context) activation.Event {
			if err := a.deps.holds().Release(c, e.Hold.Holder, holdRef(e.Hold)); err != nil {
				a.deps.Log.Warn("release of the request's hold failed; it will expire", "request", e.Hold.RequestID, "err", err)
			}
			return activation.Released{Now: a.now()}
		})
	case activation.NoticeFenced:
		a.noticeFenced(e)
	case activation.NoticeHoldLost:
		st := e.State
		a.deps.Log.Warn("the request's hold is gone; a resume cannot pull it", "request", st.RequestId, "transfer", st.Params.GetTransferId(),
			"holder", st.Params.GetRemoteCtrl().GetMember(), "code", e.Reason, "policy", a.deps.LoadFailurePolicy)
		a.deps.Publish(api.HoldLostSubject(a.deps.Self, st.EngineId), &messages.HoldLostNotice{
			RequestId: st.RequestId, Epoch: st.Epoch, TransferId: st.Params.GetTransferId(), Holder: st.Params.GetRemoteCtrl().GetMember(),
			ErrorCode: e.Code, Reason: e.Reason, KvLoadFailurePolicy: a.deps.LoadFailurePolicy,
		})
	case activation.NoticeResume:
		a.deps.Publish(api.ResumeSubject(a.deps.Self, e.State.EngineId), &messages.ResumeNotice{State: e.State})
	case activation.Reply:
		to, ok := a.calls[e.Call]
		if !ok {
			return
		}
		delete(a.calls, e.Call)
		rep := RequestReply{Err: e.Err}
		if e.Err == nil {
			rep.Status = &messages.RequestStatus{State: e.State, Status: e.Status}
		}
		ctx.Send(to, rep)
	case activation.Arm:
		if a.timer != nil {
			a.timer.Stop()
		}
		self, sys := a.self, a.system
		a.timer = a.deps.clock().AfterFunc(e.At.Sub(a.now()), func() { sys.Root.Send(self, renewTick{}) })
	case activation.Stop:
		if e.Reason != "" {
			a.deps.Log.Info(e.Reason, "request", a.core.ID())
		}
		ctx.Stop(ctx.Self())
	case activation.Count:
		a.count(e)
	}
}

// io runs f off the mailbox, bounded by StoreTimeout, and steps its result.
func (a *requestActor) io(f func(context.Context) activation.Event) {
	self, sys, timeout := a.self, a.system, a.deps.StoreTimeout
	go func() {
		c, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		sys.Root.Send(self, requestIODone{ev: f(c)})
	}()
}

func holdRef(h activation.HoldRef) *messages.HoldRef {
	return &messages.HoldRef{TransferId: h.TransferID, Requester: h.Engine, RequestId: h.RequestID}
}

// renew keeps the hold alive and says what the holder answered: gone for
// good (unknown, expired, released, engine gone), or failed for now.
func (a *requestActor) renew(c context.Context, h activation.HoldRef) activation.Event {
	err := a.deps.holds().Renew(c, h.Holder, holdRef(h))
	if err == nil {
		return activation.Renewed{Now: a.now(), Result: activation.RenewOK}
	}
	switch code := api.CodeOf(err); code {
	case api.CodeUnknownTransfer, api.CodeExpired, api.CodeReleased, api.CodeEngineGone:
		return activation.Renewed{Now: a.now(), Result: activation.RenewGone, Code: uint32(code), Reason: code.Name()}
	}
	// The holder is unreachable or slow: try again next period.
	a.deps.Log.Warn("keep-alive of the request's hold failed", "request", h.RequestID, "transfer", h.TransferID, "err", err)
	return activation.Renewed{Now: a.now(), Result: activation.RenewFailed}
}

// count increments a metric the activation names, with its log line.
func (a *requestActor) count(e activation.Count) {
	m := a.deps.metrics()
	switch e.What {
	case activation.TakenOver:
		m.TakenOver.Add(1)
		if st := a.core.State(); st != nil {
			a.deps.Log.Info("request taken over", "request", st.RequestId, "from", e.From, "engine", st.EngineId, "epoch", st.Epoch)
		}
	case activation.Adopted:
		m.Adopted.Add(1)
		if st := a.core.State(); st != nil {
			a.deps.Log.Info("request adopted", "request", st.RequestId, "from", e.From, "epoch", st.Epoch, "engine", st.EngineId)
		}
	case activation.Fenced:
		m.Fenced.Add(1)
	case activation.HoldLost:
		m.HoldsLost.Add(1)
	case activation.GrantMoved:
		m.GrantsMoved.Add(1)
	case activation.GrantLapsed:
		m.GrantsLapsed.Add(1)
	}
}

// noticeFenced tells the request's engine that its activation is fenced,
// naming the member that owns the request now. With LookupOwner the owner
// is read in the background, so that the write that found the fence
// answers at once: a store that has just said "fenced" can be recovering
// from the partition that caused it (JetStream answers "temporarily
// unavailable" for a moment after a partition heals, and a deposed leader
// may still answer a read with the state from before). The notice goes out
// when the owner is known, or with no owner after a few seconds of trying.
func (a *requestActor) noticeFenced(e activation.NoticeFenced) {
	publish := a.deps.Publish
	notice := func(owner string) {
		publish(api.FencedSubject(a.deps.Self, e.Engine), &messages.FencedNotice{RequestId: e.RequestID, StaleEpoch: e.StaleEpoch, NewOwner: owner})
	}
	if !e.LookupOwner {
		if e.NewOwner != a.deps.Self {
			a.deps.Log.Warn("request fenced: it moved to another member", "request", e.RequestID, "epoch", e.StaleEpoch, "new_owner", e.NewOwner)
		}
		notice(e.NewOwner)
		return
	}
	store, log, timeout, clk, self := a.deps.Store, a.deps.Log, a.deps.StoreTimeout, a.deps.clock(), a.deps.Self
	go func() {
		owner := ""
		deadline := clk.Now().Add(2 * timeout)
		for attempt := 1; ; attempt++ {
			c, cancel := context.WithTimeout(context.Background(), time.Second)
			cur, _, err := store.Head(c, e.RequestID)
			cancel()
			// The write was refused, so the state moved on: a read that
			// shows it as this activation left it comes from a server that
			// has not heard yet (a stream leader deposed by the partition
			// that caused the fence answers for a moment after the heal).
			if err == nil && cur.Owner == self && cur.Epoch == e.StaleEpoch {
				err = fmt.Errorf("read the request as it was before the fence (a stale server)")
			}
			if err == nil {
				owner = cur.Owner
				break
			}
			if errors.Is(err, requests.ErrNotFound) || clk.Now().After(deadline) {
				log.Debug("the owner of a fenced request is unknown", "request", e.RequestID, "attempts", attempt, "err", err)
				break
			}
			_, wait := clk.NewTimer(200 * time.Millisecond)
			<-wait
		}
		log.Warn("request fenced: it moved to another member", "request", e.RequestID, "epoch", e.StaleEpoch, "new_owner", owner)
		notice(owner)
	}()
}
