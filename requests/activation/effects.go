package activation

import (
	"time"

	"github.com/connex/connex/messages"
)

// Effect is something the caller must do after a Step, in order.
type Effect interface{ effect() }

// Claim reserves request ID in the member's table of live activations. The
// caller answers at once with Claimed, before any other event.
type Claim struct{ ID string }

// Load reads request ID's stored state; the caller answers with Loaded.
// Without Whole it reads only the record (requests.Store.Head): the prompt's
// token ids and the hold's block ids are left out.
type Load struct {
	ID    string
	Whole bool
}

// WriteOp is the kind of a Write.
type WriteOp int

const (
	// Create stores a new request (it must not exist).
	Create WriteOp = iota
	// Update replaces the state at revision Rev (compare-and-set).
	Update
	// Delete removes the state at revision Rev (compare-and-set).
	Delete
)

var writeOpNames = [...]string{"create", "update", "delete"}

// String is the op's name in scripts.
func (o WriteOp) String() string { return writeOpNames[o] }

// Write is a compare-and-set write of request ID's durable state; the
// caller answers with Written. State is nil for Delete. Prompt says that an
// Update stores State's prompt too (requests.PromptDue: a new prompt, or
// the stored one due again); otherwise it writes only the record, whatever
// the prompt's length. A Create always stores the prompt (Prompt is set).
type Write struct {
	Op     WriteOp
	ID     string
	State  *messages.RequestState
	Rev    uint64
	Prompt bool
}

// HoldRef names the request's hold and who keeps it: the holder member,
// the transfer, and the engine and request it is renewed for.
type HoldRef struct {
	Holder, TransferID, Engine, RequestID string
}

// Renew keeps the request's hold alive (and binds it to Hold.Engine); the
// caller answers with Renewed.
type Renew struct{ Hold HoldRef }

// Release gives the request's hold back; the caller answers with Released.
// An activation emits it at most once, and never after the hold was lost.
type Release struct{ Hold HoldRef }

// NoticeFenced tells Engine that its activation of RequestID at
// StaleEpoch is fenced: NewOwner runs the request now. With LookupOwner the
// caller reads the owner from the store first (in the background: the
// activation has ended), and NewOwner is empty.
type NoticeFenced struct {
	RequestID, Engine string
	StaleEpoch        uint64
	NewOwner          string
	LookupOwner       bool
}

// NoticeHoldLost tells the request's engine that its hold is gone for good
// (Code, Reason): a resume cannot pull it.
type NoticeHoldLost struct {
	State  *messages.RequestState
	Code   uint32
	Reason string
}

// NoticeResume tells the adopting engine to resume State.
type NoticeResume struct{ State *messages.RequestState }

// Reply answers Call: Status ("running", "finished") with the request's
// state, or Err.
type Reply struct {
	Call   uint64
	Status string
	State  *messages.RequestState
	Err    error
}

// Arm schedules the next RenewTick at At (replacing any earlier one).
type Arm struct{ At time.Time }

// Stop ends the actor: the activation ended for Reason, a line for the
// log; empty when the Reply before it carries the error that ended it.
type Stop struct{ Reason string }

// Metric is a counter Count increments.
type Metric int

const (
	// TakenOver counts takeovers (a resume the router decided).
	TakenOver Metric = iota
	// Adopted counts orphans adopted.
	Adopted
	// Fenced counts activations fenced.
	Fenced
	// HoldLost counts holds found gone for good.
	HoldLost
	// GrantMoved counts requests moved here on a router's grant, ahead of
	// the engine's takeover (Grant).
	GrantMoved
	// GrantLapsed counts grants whose engine never sent its takeover.
	GrantLapsed
)

var metricNames = [...]string{"taken-over", "adopted", "fenced", "hold-lost", "grant-moved", "grant-lapsed"}

// String is the metric's name in scripts.
func (m Metric) String() string { return metricNames[m] }

// Count increments a metric; From is the previous owner of a takeover or
// adoption.
type Count struct {
	What Metric
	From string
}

func (Claim) effect()          {}
func (Load) effect()           {}
func (Write) effect()          {}
func (Renew) effect()          {}
func (Release) effect()        {}
func (NoticeFenced) effect()   {}
func (NoticeHoldLost) effect() {}
func (NoticeResume) effect()   {}
func (Reply) effect()          {}
func (Arm) effect()            {}
func (Stop) effect()           {}
func (Count) effect()          {}
