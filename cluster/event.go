package cluster

import "fmt"

// EventType says what happened to a member.
type EventType int

// The membership events a subscriber receives.
const (
	// EventJoined: a member appeared (or was live when you subscribed).
	EventJoined EventType = iota + 1
	// EventLeft: a member is gone for good; Event.Reason says why. Its id
	// is never accepted again (protoactor blocks it), so whatever it hosted
	// must be placed elsewhere now.
	EventLeft
	// EventSuspect: a member went silent and is being probed. It is still
	// in the topology; avoid placing new work on it.
	EventSuspect
	// EventAlive: a suspect member answered and is trusted again.
	EventAlive
	// EventSelfEvicted: the other members removed this member. It no
	// longer heartbeats; the daemon must stop this ActorSystem and rejoin
	// with a new one (a new id).
	EventSelfEvicted
)

// String names the event type for logs.
func (t EventType) String() string {
	switch t {
	case EventJoined:
		return "joined"
	case EventLeft:
		return "left"
	case EventSuspect:
		return "suspect"
	case EventAlive:
		return "alive"
	case EventSelfEvicted:
		return "self-evicted"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Reason says why a member left. The values are also the wire spelling in
// messages.MemberGone.reason.
type Reason string

// Why a member left.
const (
	// ReasonLeave: it announced a graceful leave.
	ReasonLeave Reason = "leave"
	// ReasonUnreachable: a probe found no NATS subscriber for it, i.e. its
	// NATS connection is gone (a crashed or killed process).
	ReasonUnreachable Reason = "unreachable"
	// ReasonTimeout: it was silent for the TTL (a hung or partitioned
	// process).
	ReasonTimeout Reason = "timeout"
	// ReasonReported: another member found it dead and said so.
	ReasonReported Reason = "reported"
	// ReasonBlocked: protoactor's own gossip blocked it (its heartbeat
	// expiry fired before ours).
	ReasonBlocked Reason = "blocked"
)

// Event is one membership change, delivered to Subscribe callbacks.
type Event struct {
	// Type is what happened.
	Type EventType
	// Member is the member it happened to, as last seen.
	Member Member
	// Reason is set for EventLeft and EventSelfEvicted.
	Reason Reason
}

// String renders the event for logs and tests.
func (e Event) String() string {
	if e.Reason != "" {
		return fmt.Sprintf("%s %s (%s)", e.Type, e.Member.ID, e.Reason)
	}
	return fmt.Sprintf("%s %s", e.Type, e.Member.ID)
}
