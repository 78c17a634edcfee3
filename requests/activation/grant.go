package activation

import (
	"errors"
	"fmt"
	"time"

	"github.com/connex/connex/requests"
)

// A takeover moved on the router's word (Grant).
//
// A resume's takeover used to start when the new engine's request.start
// arrived, milliseconds after the router's peer.grant reached this member
// (vLLM's front end and the engine's next step lie between), and the
// engine's pull waited for it. With Grant the member moves the request to
// the granted engine when the grant arrives — read, compare-and-set at the
// next epoch, renew (which binds the hold to the engine) — and the
// engine's takeover, when it comes, only confirms it: its tokens are
// merged into the record and it is answered at once, the write following.
//
//	Grant ──► Starting ── claim, read, CAS write ──► Running (unconfirmed) ── engine's takeover ──► Running
//	               │ not stored, race lost, store down               │ another local engine's takeover: a takeover as before
//	               ▼                                                  │ not confirmed within the grant's TTL: record deleted, hold released
//	   Idle (fell back): the engine's takeover starts as without a grant; none within the TTL: stop
//
// The grant only moves work earlier: whatever it cannot do, the engine's
// takeover does as it would have without it. A grant lapses after its
// TTL (Grant.TTL), as long as its router waits for a resumed leg's first
// token (router_first_token_ms; requests.GrantTTL, 30 s, when the router
// named none): a moved request whose engine has not confirmed it by then
// was given up by its router.

// grantState is where a Grant-moved activation is.
type grantState int

const (
	grantNone        grantState = iota // no grant (or confirmed)
	grantMoving                        // the grant's read and write are in flight
	grantUnconfirmed                   // moved: its engine has not sent its takeover yet
	grantFellBack                      // could not move it: idle, waiting for the engine's takeover
)

// beginGrant starts moving request o.id to engine o.engine.
func (a *Activation) beginGrant(now time.Time, o op) []Effect {
	if a.phase != Idle || a.id != "" {
		return []Effect{Reply{Call: o.call, Err: fmt.Errorf("%w: request %s runs here", requests.ErrExists, a.id)}}
	}
	a.phase, a.cur, a.waiting = Starting, &o, waitClaim
	a.id, a.instance = o.id, o.instance
	a.grant, a.grantedAt, a.grantTTL = grantMoving, now, o.ttl
	return []Effect{Claim{ID: a.id}}
}

// loadedGrant moves the stored request to the granted engine at the next
// epoch: an adoption from whoever owns it now.
func (a *Activation) loadedGrant(now time.Time, e Loaded) []Effect {
	o := a.cur
	if e.Err != nil {
		return a.fallBack(now, e.Err)
	}
	next, err := requests.Adopt(e.State, e.State.Owner, a.self, o.engine, now)
	if err != nil {
		return a.fallBack(now, err)
	}
	a.pending, a.from = next, e.State.Owner
	a.waiting = waitWrite
	// The record alone (Head): its prompt is not in hand, so this write
	// does not store it (the confirmation's, which has the resent tokens,
	// does when it is due) — unless the record is one written before the
	// prompt split, which holds its prompt and gets its key only now.
	inHand := e.State.GetPromptKey() == "" && len(e.State.GetPromptTokenIds()) > 0
	return []Effect{Write{Op: Update, ID: a.id, State: next, Rev: e.Rev, Prompt: inHand && requests.PromptDue(e.State, next, a.promptRefresh)}}
}

// writtenGrant runs the moved request (unconfirmed) and binds its hold, or
// retries a lost race, or falls back.
func (a *Activation) writtenGrant(now time.Time, e Written) []Effect {
	if e.Err != nil {
		if errors.Is(e.Err, requests.ErrFenced) && a.attempt < takeoverAttempts-1 {
			a.attempt++
			a.waiting = waitLoad
			return []Effect{Load{ID: a.id}}
		}
		return a.fallBack(now, e.Err)
	}
	a.run(e.Rev)
	a.grant = grantUnconfirmed
	fx := []Effect{Count{What: TakenOver, From: a.from}, Count{What: GrantMoved}, a.arm(now), a.reply(a.cur.call, "granted")}
	// The engine's takeover, if it came during the move, is answered now
	// rather than after the renewal.
	for i, q := range a.queue {
		if q.kind != opTakeover {
			continue
		}
		if q.msg.GetEngineId() == a.st.GetEngineId() { // the first takeover waiting, by the granted engine
			a.queue = append(a.queue[:i:i], a.queue[i+1:]...)
			fx = append(fx, a.confirmNow(now, q)...)
		}
		break
	}
	return a.renew(now, fx)
}

// fallBack leaves a grant that could not move the request idle, its id
// claimed, for the engine's takeover to start it as without a grant; the
// grant's caller gets err. A tick at the grant's end stops it.
func (a *Activation) fallBack(now time.Time, err error) []Effect {
	a.phase, a.grant = Idle, grantFellBack
	fx := []Effect{Reply{Call: a.cur.call, Err: fmt.Errorf("grant of request %s not moved ahead: %w", a.id, err)}, Arm{At: a.grantLapses()}}
	return a.done(fx)
}

// grantLapses is when a grant not taken up by its engine ends: the
// engine's takeover needs the grant, which lasts as long as its router
// asked (requests.GrantTTL when it named no lifetime).
func (a *Activation) grantLapses() time.Time {
	if a.grantTTL > 0 {
		return a.grantedAt.Add(a.grantTTL)
	}
	return a.grantedAt.Add(requests.GrantTTL)
}

// takeGranted starts an engine's takeover of a granted activation: it
// confirms the move if the engine is the granted one, else it is a
// takeover as without the grant.
func (a *Activation) takeGranted(now time.Time, o op) []Effect {
	switch a.grant {
	case grantFellBack:
		a.grant = grantNone
		a.phase, a.instance = Starting, o.instance
		a.cur = &op{kind: opStart, call: o.call, msg: o.msg, instance: o.instance}
		a.waiting = waitLoad
		return []Effect{Load{ID: a.id}}
	case grantUnconfirmed:
		if o.msg.GetEngineId() != a.st.GetEngineId() {
			a.grant = grantNone // another local engine: it fences the granted one
			return a.begin(now, o)
		}
		fx, ok := a.confirm(now, o)
		if !ok {
			return fx
		}
		return append(fx, a.write(op{kind: opConfirm}, Update, a.st)...)
	}
	// grantMoving has its read or write in flight: calls wait behind it.
	return []Effect{Reply{Call: o.call, Err: fmt.Errorf("%w: request %s is being moved here", ErrUnexpected, a.id)}}
}

// confirmsWhileBusy reports whether o, an engine's takeover, confirms a
// move whose own I/O (its renewal) is still in flight: answered then at
// once rather than after it, unless an earlier takeover waits (it goes
// first, in order).
func (a *Activation) confirmsWhileBusy(o op) bool {
	if a.grant != grantUnconfirmed || a.cur == nil || a.cur.kind != opGrant || o.msg.GetEngineId() != a.st.GetEngineId() {
		return false
	}
	for _, q := range a.queue {
		if q.kind == opTakeover {
			return false
		}
	}
	return true
}

// confirmNow confirms while the move's I/O is in flight; the write is
// queued behind it.
func (a *Activation) confirmNow(now time.Time, o op) []Effect {
	fx, ok := a.confirm(now, o)
	if ok {
		a.queue = append(a.queue, op{kind: opConfirm})
	}
	return fx
}

// confirm answers the granted engine's takeover: the same owner and
// epoch, with the tokens the router resent it merged into the record.
// The answer comes before the write (the engine's pull waits for it); the
// caller writes a.st next. ok is false when the takeover is refused.
func (a *Activation) confirm(now time.Time, o op) (fx []Effect, ok bool) {
	next, err := requests.Takeover(a.st, o.msg, a.self, now)
	if err != nil {
		return []Effect{Reply{Call: o.call, Err: err}}, false
	}
	next.Epoch, next.PreviousOwners = a.st.Epoch, a.st.PreviousOwners
	if requests.PromptDue(a.st, next, a.promptRefresh) {
		// Stored by the write that follows, or by the next one if it
		// fails for now.
		a.promptOwed = true
	}
	a.st, a.grant = next, grantNone
	if o.instance != "" {
		a.instance = o.instance
	}
	fx = []Effect{a.reply(o.call, "running")}
	if a.holdLost {
		// The move's renewal found the hold gone before the engine knew
		// the request: tell it now.
		fx = append(fx, NoticeHoldLost{State: a.st, Code: a.lost.Code, Reason: a.lost.Reason})
	}
	return fx, true
}

// writtenConfirm ends the confirmation's write. One that failed for now
// is carried by the next write (it writes the whole record, and the
// prompt if it is owed); a fence ends the activation.
func (a *Activation) writtenConfirm(e Written) []Effect {
	switch {
	case errors.Is(e.Err, requests.ErrFenced):
		return a.fenced(a.cur, e.Err)
	case e.Err != nil:
		return a.done(nil)
	}
	a.rev = e.Rev
	return a.done(nil)
}

// tickGranted ends a grant its engine did not take up in time: an idle
// one stops; a moved one deletes the request's record and releases its
// hold, unless someone took it over since (the delete then finds a newer
// revision). After a delete that got no answer it reads first: the
// delete may have landed. ok is false when the tick is an ordinary
// keep-alive.
func (a *Activation) tickGranted(now time.Time) (fx []Effect, ok bool) {
	if a.grant == grantNone || a.grant == grantMoving || now.Before(a.grantLapses()) {
		return nil, false
	}
	if a.grant == grantFellBack {
		return a.end([]Effect{Count{What: GrantLapsed}}, "the router's grant of this request was not taken up by its engine", nil), true
	}
	if a.lapseUnsure {
		a.cur, a.waiting = &op{kind: opGrantLapsed}, waitLoad
		return []Effect{Load{ID: a.id}}, true
	}
	return a.write(op{kind: opGrantLapsed}, Delete, nil), true
}

// loadedLapse goes on with a lapse whose delete got no answer: still
// this activation's, it is deleted now; anyone else's, it runs elsewhere;
// gone, either this activation's delete landed or a newer owner finished
// it (and released the hold): it ends without a release, and a hold still
// there expires by its lease.
func (a *Activation) loadedLapse(e Loaded) []Effect {
	switch {
	case errors.Is(e.Err, requests.ErrNotFound):
		return a.end([]Effect{Count{What: GrantLapsed}}, "the router's grant of this request was not taken up; its record is gone and its hold left to expire", nil)
	case e.Err != nil:
		return a.done([]Effect{Arm{At: e.Now.Add(a.renewEvery())}})
	case e.State.GetOwner() != a.self || e.State.GetEpoch() != a.st.GetEpoch():
		return a.end([]Effect{Count{What: GrantLapsed}}, "the router's grant of this request was not taken up; it runs elsewhere now", nil)
	}
	a.rev, a.lapseUnsure = e.Rev, false
	return a.write(op{kind: opGrantLapsed}, Delete, nil)
}

// writtenLapse releases the hold of a lapsed grant's request once its
// record is deleted; a fence (someone took it over) ends it without; a
// store that did not answer is asked again a keep-alive period later.
func (a *Activation) writtenLapse(now time.Time, e Written) []Effect {
	switch {
	case errors.Is(e.Err, requests.ErrFenced):
		return a.end([]Effect{Count{What: GrantLapsed}}, "the router's grant of this request was not taken up; it runs elsewhere now", nil)
	case e.Err != nil:
		a.lapseUnsure = true
		return a.done([]Effect{Arm{At: now.Add(a.renewEvery())}})
	}
	return a.release([]Effect{Count{What: GrantLapsed}})
}
