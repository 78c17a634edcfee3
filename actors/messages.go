package actors

import (
	"time"

	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/lease"
	"github.com/connex/connex/messages"
)

// In-process messages. Everything that crosses a process boundary is a
// protobuf message from package messages; these only travel between
// goroutines of one connexd.

// CreateHold asks the HoldSupervisor for a new hold actor. The reply is a Reply
// with Create set, or Err.
type CreateHold struct {
	ID            string
	Req           *messages.CreateHoldRequest
	Region        *kvmem.Mapped
	ReleaseRegion func() // called once when the hold stops touching the region
	// MoreRanks are the regions of TP ranks 1 .. tp_size-1 of a
	// tensor-parallel engine (Region is rank 0's), alike but for the rank;
	// the hold spans the same blocks in each. ReleaseMoreRanks is called
	// once when the hold stops touching them.
	MoreRanks        []*kvmem.Mapped
	ReleaseMoreRanks func()
	Lease            lease.Config
}

// RebindHold binds a hold to the engine that runs its request at Epoch
// (lease.Rebind). Reply: Status or Err.
type RebindHold struct {
	Consumer string
	Request  string
	Epoch    uint64
}

// RenewHold extends the lease. Reply: Status or Err.
type RenewHold struct{ By string }

// StartRead begins a pull of the hold. Reply: Desc or Err (or Unbound).
type StartRead struct {
	By      string
	PullID  string
	Timeout time.Duration
	Layout  kvmem.Layout
	// Request, when set, is the request the pull is for. Unless the hold
	// is bound to By for that request already, the read does not start
	// and the reply is Unbound: the caller binds the hold from the
	// request's durable state (which the actor cannot read) and asks
	// again without Request.
	Request string
}

// EndRead ends a pull. Reply: Status or Err.
type EndRead struct {
	PullID string
	OK     bool
	// By is the reader that ends it: it must be the one that started it.
	By string
}

// ReleaseHold ends the hold. Reply: Status or Err.
type ReleaseHold struct{ By string }

// InspectHold asks for the status. Reply: Status, Consumer and Request.
type InspectHold struct{}

// EngineGone ends the hold because its engine went away. Reply: Status.
type EngineGone struct{}

// Shutdown ends the hold because connexd stops (lease.Shutdown): running
// pulls' read marks go, the blocks are freed and the engine told, reason
// "shutdown"; a hold that already ended is left as it was. Reply: Status
// (state "shutdown", freed, unless it had ended before).
type Shutdown struct{}

type tick struct{}

// Reply is the answer of a hold actor.
type Reply struct {
	Create *messages.CreateHoldReply
	Status *messages.HoldStatus
	Desc   *messages.Descriptors
	// Consumer is the engine the hold serves ("" while unbound) and
	// Request the request it is bound to, in InspectHold's reply.
	Consumer, Request string
	// Unbound answers a StartRead for a request the hold is not bound to.
	Unbound bool
	Err     error
}
