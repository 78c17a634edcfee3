package activation

import "github.com/connex/connex/messages"

// BindCall is a call on a hold (renew, release, pull) that names the
// request it is made for: the holder binds the hold to the request's
// engine before judging the call, if the request's durable state says so.
// This is the rebind rule a holder applies to a call its hold would refuse
// (bound to another engine, or to no request yet).
type BindCall struct {
	Transfer, Requester, Request string
}

// Applies reports whether the rule applies at all: the call names both
// its engine and its request.
func (c BindCall) Applies() bool { return c.Requester != "" && c.Request != "" }

// Bound reports whether a hold bound to consumer for request already
// serves the call: then nothing is read or rebound.
func (c BindCall) Bound(consumer, request string) bool {
	return consumer == c.Requester && request == c.Request
}

// Rebind is the epoch to bind the hold at, read from the request's stored
// state st (or the read's error): ok only if the state names this transfer
// and the caller as the engine that runs it. The hold itself then orders
// bindings by epoch (lease.Rebind).
func (c BindCall) Rebind(st *messages.RequestState, err error) (epoch uint64, ok bool) {
	if err != nil || st.GetParams().GetTransferId() != c.Transfer || st.GetEngineId() != c.Requester {
		return 0, false
	}
	return st.GetEpoch(), true
}
