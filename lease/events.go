package lease

import "time"

// Effect is something the caller must do after a Step, in order.
type Effect interface{ effect() }

// Deregister revokes the data-plane registration of the hold's memory. It
// always precedes Free.
type Deregister struct{}

// Free hands the blocks back to the engine: the caller returns them to the
// block accounting (Unhold) and, if Notify, tells the engine with a
// BlocksFreed notice whose reason is Reason.String() ("released",
// "expired", "pulled", "shutdown", "aborted"). Notify is false when the
// engine is gone and there is nobody to tell. A hold emits Free exactly
// once, whatever ends it.
type Free struct {
	Reason State
	Notify bool
}

// PullAbandoned reports a pull dropped because its deadline passed without
// a PullEnd (the reader died or hung). Its EndRead precedes it.
type PullAbandoned struct{ PullID string }

// BeginRead marks the hold's blocks as read by pull PullID (the block
// accounting's BeginRead). It follows the PullStart that starts the pull,
// never a repeated start by the same reader, and one EndRead of the same
// pull always follows it before or with the Free.
type BeginRead struct{ PullID string }

// EndRead ends the read marked by BeginRead{PullID} (the block
// accounting's EndRead): on the pull's PullEnd, its abandonment, or the
// hold's end while it ran (EngineGone, Shutdown, Abort), before Deregister.
type EndRead struct{ PullID string }

func (Deregister) effect()    {}
func (Free) effect()          {}
func (PullAbandoned) effect() {}
func (BeginRead) effect()     {}
func (EndRead) effect()       {}

// Event is an input to Step.
type Event interface{ event() }

// Renew extends the lease by Retain from Now.
type Renew struct {
	Now time.Time
	By  string
}

// PullStart records that a reader starts reading; it renews the lease. The
// reader promises to end (PullEnd) before Deadline; if it does not, the
// pull is abandoned at Deadline. A PullStart of a running pull by the same
// reader (a retry whose first answer was lost) only renews the lease;
// by another reader it is ErrDuplicate.
type PullStart struct {
	Now      time.Time
	By       string
	PullID   string
	Deadline time.Time
}

// PullEnd records that a reader stopped reading, successfully or not. By
// must be the reader that started the pull: another one gets ErrNotYours
// and changes nothing.
type PullEnd struct {
	Now    time.Time
	By     string
	PullID string
	OK     bool
}

// Release ends the hold at the consumer's or owner's request.
type Release struct {
	Now time.Time
	By  string
}

// Rebind binds a hold to Consumer, the engine that runs the hold's request
// Request at Epoch. The caller has checked that (the request's durable
// state names Consumer and this transfer at Epoch, fenced by
// compare-and-set); the hold orders bindings and keeps them to one request.
// A hold created without a consumer accepts every requester until its
// first Rebind binds it (the decode leg's request.start); one created with
// a consumer is first bound to a request at epoch 1 only by that consumer. From then
// on only a Rebind for the same request moves it (a resume), and only at a
// newer epoch (else ErrStaleBinding); another request's is ErrNotYours, so
// an engine cannot bind a hold by starting a request of its own on it.
type Rebind struct {
	Now      time.Time
	Consumer string
	Request  string
	Epoch    uint64
}

// Tick tells the hold the time; it expires the lease and abandons pulls
// whose deadline passed.
type Tick struct{ Now time.Time }

// EngineGoneEvent ends the hold because its engine went away.
type EngineGoneEvent struct{ Now time.Time }

// Shutdown ends the hold at once because its daemon stops: running pulls
// end (their reads were cancelled first), the blocks are freed and the
// engine told, reason "shutdown". On a hold that already ended it does
// nothing and is no error.
type Shutdown struct{ Now time.Time }

// Abort ends the hold at once because its owner stops for another reason
// than the hold's own end (the actor panicked): like Shutdown, with reason
// "aborted". On a hold that already ended it does nothing and is no error,
// so an owner can step it whenever it stops.
type Abort struct{ Now time.Time }

func (Renew) event()           {}
func (PullStart) event()       {}
func (PullEnd) event()         {}
func (Release) event()         {}
func (Rebind) event()          {}
func (Tick) event()            {}
func (EngineGoneEvent) event() {}
func (Shutdown) event()        {}
func (Abort) event()           {}

// eventTime is the time an event carries.
func eventTime(ev Event) time.Time {
	switch e := ev.(type) {
	case Renew:
		return e.Now
	case PullStart:
		return e.Now
	case PullEnd:
		return e.Now
	case Release:
		return e.Now
	case Tick:
		return e.Now
	case Rebind:
		return e.Now
	case EngineGoneEvent:
		return e.Now
	case Shutdown:
		return e.Now
	case Abort:
		return e.Now
	}
	return time.Time{}
}
