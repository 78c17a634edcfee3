package cluster

import (
	"strconv"
	"time"

	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// Role is what a member does in P/D serving. It travels as a string so that
// members of a newer version may add roles.
type Role string

// The roles a connexd member can advertise.
const (
	// RolePrefill members run prompts and keep the KV holds.
	RolePrefill Role = "prefill"
	// RoleDecode members pull KV and host the request actors.
	RoleDecode Role = "decode"
	// RoleRouter members are front doors that host no request state.
	RoleRouter Role = "router"
)

// Member is one live member as this process sees it.
type Member struct {
	// ID is the member's protoactor ActorSystem id, fresh for every
	// process start.
	ID string
	// Host and Port are where its protoactor remote listens.
	Host string
	Port int
	// Role is what it advertised.
	Role Role
	// Kinds are the cluster kinds it can host.
	Kinds []string
	// Load is the figure it last advertised (e.g. in-flight requests).
	Load int64
	// Name is the connexd member name (config member_id) used on the
	// subject API; stable across restarts, unlike ID. May be empty for
	// members that are not connexd daemons.
	Name string
	// Engines are the engines registered with the member (role, model,
	// HTTP base URL, load), as of its last heartbeat.
	Engines []*messages.EngineInfo
	// HeartbeatInterval is the interval its last heartbeat said it keeps:
	// Config.HeartbeatInterval while it has work in hand, its idle
	// interval otherwise; 0 when it did not say (an older member).
	// Peers suspect it after SuspectMult of these, at most TTL/2.
	HeartbeatInterval time.Duration
	// Suspect is true while it is silent and being probed; placement
	// should avoid a suspect member.
	Suspect bool

	// record is the wire bytes of the announce this member was read from,
	// less its volatile fields (announcecodec.go): two members with the
	// same non-empty record have the same fields but Load and Suspect.
	record string
}

// Address is the member's protoactor remote address, host:port, spelled
// the way protoactor spells it (PIDs and EndpointTerminatedEvent carry it).
func (m Member) Address() string {
	return m.Host + ":" + strconv.Itoa(m.Port)
}

// clone returns m with its own Kinds slice, so that callers cannot alias
// the view's state.
func (m Member) clone() Member {
	m.Kinds = append([]string(nil), m.Kinds...)
	if m.Engines != nil {
		es := make([]*messages.EngineInfo, len(m.Engines))
		for i, e := range m.Engines {
			es[i] = proto.Clone(e).(*messages.EngineInfo)
		}
		m.Engines = es
	}
	return m
}
