package activation

import (
	"errors"
	"fmt"
	"time"

	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
)

// ErrUnexpected is Step's answer to a result nobody waited for (a Written
// with no write in flight): the caller's bug, and nothing changed.
var ErrUnexpected = errors.New("activation: unexpected result")

// takeoverAttempts bounds the reads and writes of a takeover or creation
// that races another writer.
const takeoverAttempts = 4

// defaultRenewEvery is the keep-alive period of a request whose params
// carry no retain_s.
const defaultRenewEvery = 20 * time.Second

// Phase is where an activation is in its life.
type Phase int

const (
	// Idle: nothing started yet.
	Idle Phase = iota
	// Starting: the start or adoption is claiming the request.
	Starting
	// Running: this activation owns the request.
	Running
	// Ended: finished, fenced, refused or gone; the actor stops.
	Ended
)

var phaseNames = [...]string{"idle", "starting", "running", "ended"}

// String is the phase's name in scripts.
func (p Phase) String() string { return phaseNames[p] }

// opKind is the kind of a queued or running call.
type opKind int

const (
	opStart opKind = iota
	opAdopt
	opProgress
	opTakeover
	opFinish
	opEngineLost
	opTick
	opInspect
	opNoHold      // the request's hold never existed: its record goes
	opGrant       // the router's grant moves the request here (grant.go)
	opConfirm     // the granted engine's takeover: its write
	opGrantLapsed // no takeover came for the grant: its record goes
)

// op is one call (or timer tick) the activation works on.
type op struct {
	kind     opKind
	call     uint64
	msg      *messages.StartRequestMsg
	instance string
	epoch    uint64
	tokens   []uint32
	id       string
	dead     string
	engine   string
	ttl      time.Duration // opGrant: the grant's lifetime (0: requests.GrantTTL)
}

// wait is the result the running op waits for.
type wait int

const (
	waitNothing wait = iota
	waitClaim
	waitLoad
	waitWrite
	waitRenew
	waitRelease
)

// Activation is the core of one request actor. Not safe for concurrent
// use: one actor owns it.
type Activation struct {
	self     string // this member: the owner written into states
	phase    Phase
	id       string
	st       *messages.RequestState // the state as last stored by this activation
	rev      uint64
	instance string
	// holdLost: the holder answered that the hold is gone; nothing renews
	// or releases it any more.
	holdLost bool
	// held: a renewal found the hold alive once.
	held     bool
	released bool
	// cur is the op in flight and waiting what it waits for; nil when none.
	cur     *op
	waiting wait
	// pending is the state the write in flight stores; created says the
	// takeover's write is a creation; attempt counts its tries.
	pending *messages.RequestState
	created bool
	attempt int
	from    string // the previous owner of a takeover or adoption
	queue   []op
	endErr  error
	// promptRefresh is the age at which a write stores the prompt again
	// (requests.PromptDue); 0: only when it changed.
	promptRefresh time.Duration
	// grant is where a move on the router's grant is (grant.go), from
	// grantedAt.
	grant     grantState
	grantedAt time.Time
	grantTTL  time.Duration // the grant's lifetime (0: requests.GrantTTL)
	// lapseUnsure: a lapse's delete got no answer (it may have landed).
	lapseUnsure bool
	// promptOwed: a.st's prompt is not stored yet (a confirmation changed
	// it and its write failed for now): the next write stores it.
	// writingPrompt: the write in flight stores the prompt.
	promptOwed, writingPrompt bool
	// lost is the holder's answer that found the hold gone (HoldLost).
	lost Renewed
}

// New returns an idle activation on member self.
func New(self string) *Activation { return &Activation{self: self} }

// RefreshPrompt makes a write of the record store the request's prompt
// again once the stored one is every old (requests.PromptDue): give it
// request_ttl_s / requests.PromptRefreshDiv, or a request that runs longer
// than request_ttl_s loses its prompt to the bucket's age limit and can no
// longer be adopted. It returns a.
func (a *Activation) RefreshPrompt(every time.Duration) *Activation {
	a.promptRefresh = every
	return a
}

// Phase is the activation's phase.
func (a *Activation) Phase() Phase { return a.phase }

// State is the request's state as this activation last stored it (nil
// before it claimed one).
func (a *Activation) State() *messages.RequestState { return a.st }

// ID is the request's id ("" before Start or Adopt).
func (a *Activation) ID() string { return a.id }

// Instance is the engine instance that runs the request here.
func (a *Activation) Instance() string { return a.instance }

// HoldLost reports whether the request's hold was found gone.
func (a *Activation) HoldLost() bool { return a.holdLost }

// Busy reports whether an I/O effect is outstanding.
func (a *Activation) Busy() bool { return a.cur != nil }

// Queued is the number of calls waiting for the one in flight.
func (a *Activation) Queued() int { return len(a.queue) }

// Step applies ev and returns the effects to perform, in order. Its error
// is only ErrUnexpected: a result that answers nothing.
func (a *Activation) Step(ev Event) ([]Effect, error) {
	now := eventTime(ev)
	switch e := ev.(type) {
	case Start:
		return a.submit(now, op{kind: opStart, call: e.Call, msg: e.Msg, instance: e.Instance}), nil
	case Adopt:
		return a.submit(now, op{kind: opAdopt, call: e.Call, id: e.ID, dead: e.DeadOwner, engine: e.Engine}), nil
	case Progress:
		return a.submit(now, op{kind: opProgress, call: e.Call, epoch: e.Epoch, tokens: e.Tokens}), nil
	case Takeover:
		o := op{kind: opTakeover, call: e.Call, msg: e.Msg, instance: e.Instance}
		if a.confirmsWhileBusy(o) {
			return a.confirmNow(now, o), nil
		}
		return a.submit(now, o), nil
	case Grant:
		return a.submit(now, op{kind: opGrant, call: e.Call, id: e.ID, engine: e.Engine, instance: e.Instance, ttl: e.TTL}), nil
	case Finish:
		return a.submit(now, op{kind: opFinish, call: e.Call, epoch: e.Epoch}), nil
	case EngineLost:
		return a.submit(now, op{kind: opEngineLost, engine: e.Engine, instance: e.Instance}), nil
	case RenewTick:
		return a.submit(now, op{kind: opTick}), nil
	case Inspect:
		if a.phase == Running {
			// Answered at once, even while a write is in flight.
			return []Effect{a.reply(e.Call, "running")}, nil
		}
		return a.submit(now, op{kind: opInspect, call: e.Call}), nil
	case Claimed:
		if a.waiting != waitClaim {
			return nil, fmt.Errorf("%w: claimed", ErrUnexpected)
		}
		return a.drain(now, a.claimed(now, e)), nil
	case Loaded:
		if a.waiting != waitLoad {
			return nil, fmt.Errorf("%w: loaded", ErrUnexpected)
		}
		return a.drain(now, a.loaded(now, e)), nil
	case Written:
		if a.waiting != waitWrite {
			return nil, fmt.Errorf("%w: written", ErrUnexpected)
		}
		return a.drain(now, a.written(now, e)), nil
	case Renewed:
		if a.waiting != waitRenew {
			return nil, fmt.Errorf("%w: renewed", ErrUnexpected)
		}
		return a.drain(now, a.renewed(now, e)), nil
	case Released:
		if a.waiting != waitRelease {
			return nil, fmt.Errorf("%w: released", ErrUnexpected)
		}
		return a.drain(now, a.releaseDone()), nil
	}
	return nil, fmt.Errorf("%w: event %T", ErrUnexpected, ev)
}

// submit starts o, or queues it behind the op in flight.
func (a *Activation) submit(now time.Time, o op) []Effect {
	if a.phase == Ended {
		return a.refuse(nil, o)
	}
	if a.cur != nil {
		if o.kind == opTick && a.tickQueued() {
			return nil
		}
		a.queue = append(a.queue, o)
		return nil
	}
	return a.drain(now, a.begin(now, o))
}

func (a *Activation) tickQueued() bool {
	for _, q := range a.queue {
		if q.kind == opTick {
			return true
		}
	}
	return false
}

// drain starts queued ops while none is in flight; once the activation
// ended it refuses them.
func (a *Activation) drain(now time.Time, fx []Effect) []Effect {
	for a.cur == nil && len(a.queue) > 0 {
		o := a.queue[0]
		a.queue = a.queue[1:]
		if a.phase == Ended {
			fx = a.refuse(fx, o)
			continue
		}
		fx = append(fx, a.begin(now, o)...)
	}
	return fx
}

// refuse answers a call that came after the end.
func (a *Activation) refuse(fx []Effect, o op) []Effect {
	if o.call == 0 {
		return fx
	}
	err := a.endErr
	if err == nil {
		err = fmt.Errorf("%w: request %s: its activation here ended", requests.ErrNotFound, a.id)
	}
	return append(fx, Reply{Call: o.call, Err: err})
}

// begin starts o with nothing in flight.
func (a *Activation) begin(now time.Time, o op) []Effect {
	switch {
	case o.kind == opGrant:
		return a.beginGrant(now, o)
	case o.kind == opTakeover && a.grant != grantNone:
		return a.takeGranted(now, o)
	case o.kind == opTick:
		if fx, ok := a.tickGranted(now); ok {
			return fx
		}
	}
	switch o.kind {
	case opStart, opAdopt:
		if a.phase != Idle {
			return []Effect{Reply{Call: o.call, Err: fmt.Errorf("%w: request %s runs here", requests.ErrExists, a.id)}}
		}
		return a.start(now, o)
	case opInspect:
		if a.phase == Idle {
			return []Effect{Reply{Call: o.call, Err: fmt.Errorf("%w: no request started", requests.ErrNotFound)}}
		}
		return []Effect{a.reply(o.call, "running")}
	}
	if a.phase != Running {
		return a.refuse(nil, o)
	}
	switch o.kind {
	case opProgress:
		next, err := requests.Append(a.st, o.epoch, o.tokens, now)
		if err != nil {
			return []Effect{Reply{Call: o.call, Err: err}}
		}
		return a.write(o, Update, next)
	case opTakeover:
		next, err := requests.Takeover(a.st, o.msg, a.self, now)
		if err != nil {
			return []Effect{Reply{Call: o.call, Err: err}}
		}
		return a.write(o, Update, next)
	case opFinish:
		if o.epoch != a.st.Epoch {
			return []Effect{Reply{Call: o.call, Err: fmt.Errorf("%w: epoch %d, current %d", requests.ErrFenced, o.epoch, a.st.Epoch)}}
		}
		return a.write(o, Delete, nil)
	case opEngineLost:
		if a.st.EngineId != o.engine || (o.instance != "" && o.instance != a.instance) {
			return nil
		}
		return a.write(o, Delete, nil)
	case opTick:
		a.cur, a.waiting = &o, waitLoad
		return []Effect{Load{ID: a.id}}
	case opConfirm:
		return a.write(o, Update, a.st)
	}
	return nil
}

// start validates a Start or Adopt and claims the request id.
func (a *Activation) start(now time.Time, o op) []Effect {
	a.phase = Starting
	a.cur = &o
	if o.kind == opAdopt {
		a.id = o.id
	} else {
		st, err := requests.New(o.msg, a.self, now)
		if err != nil {
			a.id = o.msg.GetRequestId()
			return a.fail(nil, err)
		}
		a.id, a.pending, a.instance = st.RequestId, st, o.instance
	}
	a.waiting = waitClaim
	return []Effect{Claim{ID: a.id}}
}

func (a *Activation) claimed(now time.Time, e Claimed) []Effect {
	o := a.cur
	if !e.OK {
		what := "runs here"
		if o.kind == opAdopt || o.kind == opGrant {
			what = "already runs here"
		}
		return a.fail(nil, fmt.Errorf("%w: %s %s", requests.ErrExists, a.id, what))
	}
	if o.kind == opStart && !o.msg.GetTakeover() {
		a.waiting = waitWrite
		return []Effect{Write{Op: Create, ID: a.id, State: a.pending, Prompt: requests.PromptDue(nil, a.pending, a.promptRefresh)}}
	}
	a.waiting = waitLoad
	return []Effect{Load{ID: a.id, Whole: o.kind == opAdopt}}
}

func (a *Activation) loaded(now time.Time, e Loaded) []Effect {
	o := a.cur
	switch o.kind {
	case opGrant:
		return a.loadedGrant(now, e)
	case opGrantLapsed:
		return a.loadedLapse(e)
	case opStart: // a takeover
		if errors.Is(e.Err, requests.ErrNotFound) {
			st, err := requests.New(o.msg, a.self, now)
			if err != nil {
				return a.fail(nil, err)
			}
			a.pending, a.created = st, true
			a.waiting = waitWrite
			return []Effect{Write{Op: Create, ID: a.id, State: st, Prompt: requests.PromptDue(nil, st, a.promptRefresh)}}
		}
		if e.Err != nil {
			return a.fail(nil, e.Err)
		}
		next, err := requests.Takeover(e.State, o.msg, a.self, now)
		if err != nil {
			return a.fail(nil, err)
		}
		a.pending, a.created, a.from = next, false, e.State.Owner
		a.waiting = waitWrite
		return []Effect{Write{Op: Update, ID: a.id, State: next, Rev: e.Rev, Prompt: requests.PromptDue(e.State, next, a.promptRefresh)}}
	case opAdopt:
		if e.Err != nil {
			return a.fail(nil, e.Err)
		}
		next, err := requests.Adopt(e.State, o.dead, a.self, o.engine, now)
		if err != nil {
			return a.fail(nil, err)
		}
		a.pending, a.from = next, e.State.Owner
		a.waiting = waitWrite
		return []Effect{Write{Op: Update, ID: a.id, State: next, Rev: e.Rev, Prompt: requests.PromptDue(e.State, next, a.promptRefresh)}}
	case opTick:
		switch {
		case errors.Is(e.Err, requests.ErrNotFound):
			return a.end(nil, "request ended elsewhere; this activation stops", nil)
		case e.Err != nil, e.State.Epoch == a.st.Epoch && e.State.Owner == a.st.Owner:
			// Current, or the store is unreachable: keep the hold alive
			// meanwhile.
			return a.renew(now, nil)
		}
		fx := []Effect{
			NoticeFenced{RequestID: a.id, Engine: a.st.EngineId, StaleEpoch: a.st.Epoch, NewOwner: e.State.Owner},
			Count{What: Fenced},
		}
		return a.end(fx, "request fenced: it moved to another member", a.fencedErr())
	}
	return nil
}

func (a *Activation) written(now time.Time, e Written) []Effect {
	o := a.cur
	fenced := errors.Is(e.Err, requests.ErrFenced)
	if e.Err == nil && a.writingPrompt {
		a.promptOwed = false
	}
	a.writingPrompt = false
	switch o.kind {
	case opGrant:
		return a.writtenGrant(now, e)
	case opConfirm:
		return a.writtenConfirm(e)
	case opGrantLapsed:
		return a.writtenLapse(now, e)
	case opStart:
		if e.Err != nil {
			if o.msg.Takeover && (a.created || fenced) && a.attempt < takeoverAttempts-1 {
				a.attempt++
				a.waiting = waitLoad
				return []Effect{Load{ID: a.id}}
			}
			return a.fail(nil, e.Err)
		}
		a.run(e.Rev)
		// The request answers first, so that a slow holder does not delay
		// its start or its resume; the renewal then binds the hold (moves
		// it, for a takeover). The engine's pull need not wait for that:
		// its descriptors request names the request, and the holder binds
		// the hold from the stored state this write committed before it
		// judges the read (the rebind rule, BindCall).
		var fx []Effect
		if o.msg.Takeover && !a.created {
			fx = append(fx, Count{What: TakenOver, From: a.from})
		}
		fx = append(fx, a.arm(now), a.reply(o.call, "running"))
		return a.renew(now, fx)
	case opAdopt:
		if e.Err != nil {
			return a.fail(nil, e.Err)
		}
		a.run(e.Rev)
		return a.renew(now, nil)
	case opProgress:
		if fenced {
			return a.fenced(o, e.Err)
		}
		if e.Err != nil {
			return a.done([]Effect{Reply{Call: o.call, Err: e.Err}})
		}
		a.st, a.rev = a.pending, e.Rev
		return a.done([]Effect{a.summary(o.call, "running")})
	case opTakeover:
		if e.Err != nil {
			return a.fail(nil, fmt.Errorf("takeover of request %s: %w", a.id, e.Err))
		}
		old := a.st
		a.st, a.rev, a.instance = a.pending, e.Rev, o.instance
		fx := []Effect{
			NoticeFenced{RequestID: a.id, Engine: old.EngineId, StaleEpoch: old.Epoch, NewOwner: a.self},
			Count{What: TakenOver, From: old.Owner},
			Count{What: Fenced},
			a.arm(now), a.reply(o.call, "running"),
		}
		return a.renew(now, fx)
	case opFinish:
		if e.Err != nil {
			// A conflict here is a fence too: don't release someone
			// else's hold.
			return a.fail(nil, fmt.Errorf("%w: %v", requests.ErrFenced, e.Err))
		}
		return a.release(nil)
	case opEngineLost:
		if e.Err != nil {
			return a.end(nil, "request's engine went away; it runs elsewhere now", nil)
		}
		return a.release(nil)
	case opNoHold:
		// Written or not (a newer owner's record stays), this activation
		// has nothing to keep alive.
		return a.end(nil, "request's hold does not exist (hold.lost at its first renewal): its record is removed", nil)
	}
	return nil
}

// run makes the claimed state this activation's.
func (a *Activation) run(rev uint64) {
	a.st, a.rev, a.phase = a.pending, rev, Running
}

// fenced ends an activation whose write was refused: the engine is told
// (the owner read in the background) and the call answered.
func (a *Activation) fenced(o *op, err error) []Effect {
	fx := []Effect{
		NoticeFenced{RequestID: a.id, Engine: a.st.EngineId, StaleEpoch: a.st.Epoch, LookupOwner: true},
		Count{What: Fenced},
	}
	if o.call != 0 { // a confirmation's write was answered before it ran
		fx = append(fx, Reply{Call: o.call, Err: fmt.Errorf("request %s: %w", a.id, err)})
	}
	return a.end(fx, "request fenced: a write found a newer owner", a.fencedErr())
}

func (a *Activation) fencedErr() error {
	return fmt.Errorf("%w: request %s moved from this activation (epoch %d)", requests.ErrFenced, a.id, a.st.GetEpoch())
}

// renew keeps the hold alive, then continues the running op (afterRenew);
// with the hold lost it continues at once.
func (a *Activation) renew(now time.Time, fx []Effect) []Effect {
	if a.holdLost {
		return append(fx, a.afterRenew(now)...)
	}
	a.waiting = waitRenew
	return append(fx, Renew{Hold: a.holdRef()})
}

func (a *Activation) renewed(now time.Time, e Renewed) []Effect {
	var fx []Effect
	if e.Result == RenewOK {
		a.held = true
	}
	if e.Result == RenewGone && !a.holdLost {
		// For good: tell the engine once, and stop renewing.
		a.holdLost, a.lost = true, e
		fx = append(fx, Count{What: HoldLost}, NoticeHoldLost{State: a.st, Code: e.Code, Reason: e.Reason})
		if o := a.cur; !a.held && o.kind == opStart && !o.msg.Takeover {
			// A new request whose hold its first renewal found gone:
			// nothing it could resume from, and a start naming no hold
			// must not keep a record (an engine filling the request
			// store with them). The record goes; the engine was told.
			return append(fx, a.write(op{kind: opNoHold}, Delete, nil)...)
		}
	}
	return append(fx, a.afterRenew(now)...)
}

// afterRenew continues the op that renewed.
func (a *Activation) afterRenew(now time.Time) []Effect {
	o := a.cur
	switch o.kind {
	case opStart, opTakeover, opGrant:
		return a.done(nil) // armed and answered before the renewal
	case opAdopt:
		return a.done([]Effect{a.arm(now), NoticeResume{State: a.st}, Count{What: Adopted, From: a.from}, a.reply(o.call, "running")})
	case opTick:
		return a.done([]Effect{a.arm(now)})
	}
	return a.done(nil)
}

// release gives the hold back (unless it was lost), then ends the request.
func (a *Activation) release(fx []Effect) []Effect {
	if a.holdLost || a.released {
		return append(fx, a.releaseDone()...)
	}
	a.released = true
	a.waiting = waitRelease
	return append(fx, Release{Hold: a.holdRef()})
}

func (a *Activation) releaseDone() []Effect {
	o := a.cur
	switch o.kind {
	case opFinish:
		return a.end([]Effect{a.summary(o.call, "finished")}, "request finished", nil)
	case opGrantLapsed:
		return a.end(nil, "the engine granted this request never took it over: its record is deleted and its hold released", nil)
	}
	return a.end(nil, "request's engine went away and nobody took it over: its hold is released", nil)
}

// write starts a compare-and-set write of next (nil for Delete).
func (a *Activation) write(o op, w WriteOp, next *messages.RequestState) []Effect {
	prompt := next != nil && requests.PromptDue(a.st, next, a.promptRefresh) // stamps next when due
	prompt = prompt || (next != nil && a.promptOwed)
	a.cur, a.waiting, a.pending, a.writingPrompt = &o, waitWrite, next, prompt
	return []Effect{Write{Op: w, ID: a.id, State: next, Rev: a.rev, Prompt: prompt}}
}

// fail answers the running op with err and ends the activation.
func (a *Activation) fail(fx []Effect, err error) []Effect {
	return a.end(append(fx, Reply{Call: a.cur.call, Err: err}), "", err)
}

// end stops the activation; calls queued behind it get endErr (or "not
// found").
func (a *Activation) end(fx []Effect, reason string, endErr error) []Effect {
	a.phase, a.endErr = Ended, endErr
	fx = append(fx, Stop{Reason: reason})
	return a.done(fx)
}

// done finishes the running op.
func (a *Activation) done(fx []Effect) []Effect {
	a.cur, a.waiting, a.pending, a.created, a.attempt = nil, waitNothing, nil, false, 0
	return fx
}

func (a *Activation) reply(call uint64, status string) Reply {
	return Reply{Call: call, Status: status, State: a.st}
}

// summary is a reply with the state's summary (requests.Summary): what an
// engine's checkpoint and finish are answered, many times a request.
func (a *Activation) summary(call uint64, status string) Reply {
	return Reply{Call: call, Status: status, State: requests.Summary(a.st)}
}

func (a *Activation) holdRef() HoldRef {
	return HoldRef{Holder: a.st.GetParams().GetRemoteCtrl().GetMember(), TransferID: a.st.GetParams().GetTransferId(), Engine: a.st.GetEngineId(), RequestID: a.id}
}

// arm schedules the next keep-alive at a third of the hold's lease, or
// when the grant of a request moved ahead lapses, if that is sooner.
func (a *Activation) arm(now time.Time) Arm {
	at := now.Add(a.renewEvery())
	if a.grant == grantUnconfirmed && a.grantLapses().Before(at) {
		at = a.grantLapses()
	}
	return Arm{At: at}
}

// renewEvery is the keep-alive period: a third of the hold's lease.
func (a *Activation) renewEvery() time.Duration {
	if every := time.Duration(a.st.GetParams().GetRetainS()) * time.Second / 3; every > 0 {
		return every
	}
	return defaultRenewEvery
}
