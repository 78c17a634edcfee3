package auth

import (
	"errors"
	"fmt"

	"github.com/nats-io/jwt/v2"

	"github.com/connex/connex/natssubject"
)

// Roles of a NATS identity.
const (
	// RoleMember is a connexd: it serves its own member's API, calls other
	// members' peer endpoints, publishes notices to engines, and owns the
	// cluster subjects and the request bucket.
	RoleMember = "member"
	// RoleEngine is an engine shim (connex-sim, the vLLM connector, a Go
	// shim): it calls only its own member's API for its own engine id and
	// receives only its own notices and replies.
	RoleEngine = "engine"
	// RoleAdmin is an operator's tool (`connexd status`, the `nats` CLI, the
	// chaos harness): everything in the account.
	RoleAdmin = "admin"
)

// Identity is who a credentials file speaks for.
type Identity struct {
	Role   string // RoleMember, RoleEngine or RoleAdmin
	Member string // the member (RoleMember, RoleEngine)
	Engine string // the engine (RoleEngine)
	// EngineRole and Model (RoleEngine) are what the engine may register
	// (engine.register's role and model); "" allows any. Carried in the
	// user JWT's tags; connexd checks registrations against them.
	EngineRole string
	Model      string
}

// ErrIdentity means an Identity cannot be given credentials; the message
// says which field is wrong.
var ErrIdentity = errors.New("auth: bad identity")

// Validate checks the role and that each id it needs is a subject token.
func (id Identity) Validate() error {
	switch id.Role {
	case RoleAdmin, RoleMember:
		if id.EngineRole != "" || id.Model != "" {
			return fmt.Errorf("%w: only an engine identity names an engine role or model", ErrIdentity)
		}
	}
	switch id.Role {
	case RoleAdmin:
		if id.Member != "" || id.Engine != "" {
			return fmt.Errorf("%w: an admin identity names no member or engine", ErrIdentity)
		}
	case RoleMember:
		if !natssubject.ValidToken(id.Member) {
			return fmt.Errorf("%w: member id %q is not a subject token", ErrIdentity, id.Member)
		}
		if id.Member == natssubject.ReservedMemberID {
			return fmt.Errorf("%w: member id %q is reserved (engines' notice subjects start connex.v1.engine)", ErrIdentity, id.Member)
		}
		if id.Engine != "" {
			return fmt.Errorf("%w: a member identity names no engine", ErrIdentity)
		}
	case RoleEngine:
		if !natssubject.ValidToken(id.Member) {
			return fmt.Errorf("%w: member id %q is not a subject token (an engine identity names the member it calls)", ErrIdentity, id.Member)
		}
		if id.Member == natssubject.ReservedMemberID {
			return fmt.Errorf("%w: member id %q is reserved (engines' notice subjects start connex.v1.engine)", ErrIdentity, id.Member)
		}
		if !natssubject.ValidToken(id.Engine) {
			return fmt.Errorf("%w: engine id %q is not a subject token", ErrIdentity, id.Engine)
		}
		switch id.EngineRole {
		case "", EngineRolePrefill, EngineRoleDecode:
		default:
			return fmt.Errorf("%w: engine role %q (want %s or %s)", ErrIdentity, id.EngineRole, EngineRolePrefill, EngineRoleDecode)
		}
		if len(id.Model) > 256 {
			return fmt.Errorf("%w: model name longer than 256 bytes", ErrIdentity)
		}
		return nil
	default:
		return fmt.Errorf("%w: role %q (want %s, %s or %s)", ErrIdentity, id.Role, RoleMember, RoleEngine, RoleAdmin)
	}
	return nil
}

// Name is the NATS user name of the identity: "admin", "member:<m>",
// "engine:<m>/<e>". Server logs and `nats server report connections` show it.
func (id Identity) Name() string {
	switch id.Role {
	case RoleMember:
		return "member:" + id.Member
	case RoleEngine:
		return "engine:" + id.Member + "/" + id.Engine
	}
	return id.Role
}

// InboxPrefix is the prefix of the identity's reply subjects; its
// connection must use it (nats.CustomInboxPrefix, nats-py inbox_prefix),
// since it may subscribe to no other inbox: no one reads another's replies.
func (id Identity) InboxPrefix() string {
	switch id.Role {
	case RoleMember:
		return "_INBOX.m." + id.Member
	case RoleEngine:
		return "_INBOX.e." + id.Member + "." + id.Engine
	}
	return "_INBOX"
}

// Subjects an identity's permissions are written in. They mirror api's
// and cluster's layouts (api.Subject, api.EngineSubject,
// api.EngineNotices, cluster.Config.SubjectPrefix); a test keeps them equal.
const (
	apiPrefix     = "connex.v1"
	clusterPrefix = "connex.cluster"
)

// Permissions are what the NATS server lets the identity publish and
// subscribe to. Members may publish anywhere in the account (peer calls,
// notices, replies, JetStream) but subscribe only to their own API, the
// cluster subjects, service discovery and their own inbox, so no other
// member can answer for them. Engines may publish only on their own
// member's engine-scoped API for their own engine id and subscribe only to
// their own notices and inbox. Admins may do anything.
func (id Identity) Permissions() jwt.Permissions {
	var p jwt.Permissions
	switch id.Role {
	case RoleMember:
		p.Pub.Allow.Add(">")
		p.Sub.Allow.Add(
			apiPrefix+"."+id.Member+".>",
			clusterPrefix+".>",
			"$SRV.>",
			id.InboxPrefix()+".>",
		)
	case RoleEngine:
		p.Pub.Allow.Add(apiPrefix + "." + id.Member + ".e." + id.Engine + ".>")
		p.Sub.Allow.Add(
			apiPrefix+".engine."+id.Member+"."+id.Engine+".>",
			id.InboxPrefix()+".>",
		)
	case RoleAdmin:
		p.Pub.Allow.Add(">")
		p.Sub.Allow.Add(">")
	}
	return p
}
