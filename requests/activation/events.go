package activation

import (
	"time"

	"github.com/connex/connex/messages"
)

// Event is an input to Step.
type Event interface{ event() }

// Calls from the engine (through the daemon). Call names the caller for
// the Reply effect that answers it; 0 is a call nobody waits for.

// Start begins a new activation of Msg's request on this member, engine
// instance Instance. With Msg.Takeover it moves the stored request here
// at the next epoch (a resume the router decided), or creates it if it is
// not stored.
type Start struct {
	Now      time.Time
	Call     uint64
	Msg      *messages.StartRequestMsg
	Instance string
}

// Adopt begins an activation that takes over request ID, orphaned by
// DeadOwner, on local engine Engine.
type Adopt struct {
	Now                   time.Time
	Call                  uint64
	ID, DeadOwner, Engine string
}

// Progress appends generated tokens at Epoch.
type Progress struct {
	Now    time.Time
	Call   uint64
	Epoch  uint64
	Tokens []uint32
}

// Takeover moves the running request to the engine Msg names, at the next
// epoch, fencing the engine that ran it (a router-decided resume landing on
// this member).
type Takeover struct {
	Now      time.Time
	Call     uint64
	Msg      *messages.StartRequestMsg
	Instance string
}

// Grant begins an activation that moves request ID here, to local engine
// Engine (instance Instance), at the next epoch, on the word of the router
// that resumes it (peer.grant), ahead of the engine's own takeover, which
// then confirms it (grant.go).
type Grant struct {
	Now                  time.Time
	Call                 uint64
	ID, Engine, Instance string
	// TTL is how long the grant stands (requests.GrantLifetime); 0:
	// requests.GrantTTL.
	TTL time.Duration
}

// Finish ends the request at Epoch: its state is deleted and its hold
// released.
type Finish struct {
	Now   time.Time
	Call  uint64
	Epoch uint64
}

// EngineLost says a local engine went away. If it runs this request (and
// Instance, when set, is the instance that started it), the request ends
// unless another activation took it over.
type EngineLost struct {
	Now              time.Time
	Engine, Instance string
}

// RenewTick is the keep-alive timer armed by Arm: check the fence, renew
// the hold.
type RenewTick struct{ Now time.Time }

// Inspect asks for the request's state.
type Inspect struct {
	Now  time.Time
	Call uint64
}

// Results of the effects the caller ran.

// Claimed answers Claim: OK unless another activation runs the request on
// this member.
type Claimed struct {
	Now time.Time
	OK  bool
}

// Loaded answers Load: the stored state and its revision, or the store's
// error (requests.ErrNotFound when nothing is stored).
type Loaded struct {
	Now   time.Time
	State *messages.RequestState
	Rev   uint64
	Err   error
}

// Written answers Write: the new revision, or the store's error
// (requests.ErrFenced when the compare-and-set found another revision).
type Written struct {
	Now time.Time
	Rev uint64
	Err error
}

// RenewResult is what a hold's holder answered a Renew.
type RenewResult int

const (
	// RenewOK: the lease was extended.
	RenewOK RenewResult = iota
	// RenewFailed: the holder was unreachable or slow; the next tick tries
	// again.
	RenewFailed
	// RenewGone: the hold is gone for good (unknown, expired, released,
	// its engine gone); Code and Reason say which.
	RenewGone
)

// Renewed answers Renew. Code and Reason (the API's error code and its
// name) are set with RenewGone.
type Renewed struct {
	Now    time.Time
	Result RenewResult
	Code   uint32
	Reason string
}

// Released answers Release (done, or failed: the hold then expires).
type Released struct{ Now time.Time }

func (Start) event()      {}
func (Adopt) event()      {}
func (Progress) event()   {}
func (Takeover) event()   {}
func (Grant) event()      {}
func (Finish) event()     {}
func (EngineLost) event() {}
func (RenewTick) event()  {}
func (Inspect) event()    {}
func (Claimed) event()    {}
func (Loaded) event()     {}
func (Written) event()    {}
func (Renewed) event()    {}
func (Released) event()   {}

// eventTime is the time an event carries.
func eventTime(ev Event) time.Time {
	switch e := ev.(type) {
	case Start:
		return e.Now
	case Adopt:
		return e.Now
	case Progress:
		return e.Now
	case Takeover:
		return e.Now
	case Grant:
		return e.Now
	case Finish:
		return e.Now
	case EngineLost:
		return e.Now
	case RenewTick:
		return e.Now
	case Inspect:
		return e.Now
	case Claimed:
		return e.Now
	case Loaded:
		return e.Now
	case Written:
		return e.Now
	case Renewed:
		return e.Now
	case Released:
		return e.Now
	}
	return time.Time{}
}
