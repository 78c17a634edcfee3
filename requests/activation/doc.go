// Package activation decides the life of one activation of a decode
// request on this member: the request actor's core.
//
// Activation is a pure state machine in the style of lease.Hold: events go
// in through Step with the current time (a call from the engine, a timer,
// or the result of I/O the caller ran), effects come out (read or
// compare-and-set write the request's durable state, renew or release its
// hold, publish a notice, answer a call, arm the keep-alive, stop), and the
// caller performs them. It never reads a clock, starts a goroutine or
// touches the bus, so every race — a takeover during a write, a fence found
// by the keep-alive, a hold lost before the finish — is a deterministic test
// in testdata/.
//
// At most one I/O effect (Claim excepted: the caller answers it at once) is
// outstanding at a time; calls that arrive meanwhile wait in the
// activation's queue, in order, while Inspect is answered at once. So a
// slow store delays only the calls that need it.
//
// Lifecycle:
//
//	Start / Adopt ──► Starting ── claim, (read), CAS write ──► Running ──┐
//	     │ refused (invalid, claimed, fenced, store error)         │     │ Progress: CAS write
//	     ▼                                                         │     │ Takeover: CAS write, fence the old engine
//	   Ended ◄── Finish / EngineLost: delete, release the hold ────┤     │ RenewTick: read (fence check), renew
//	     ▲                                                         │     │ Renewed gone: hold lost, engine told
//	     └── fenced (a refused write, or a read naming another) ───┘◄────┘
//
// The hold is released at most once, only by the activation that deleted
// the request's state, and never after it was lost; nothing is renewed
// after the end; an activation that found itself fenced writes nothing
// more.
package activation
