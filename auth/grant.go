package auth

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/jwt/v2"
)

// Engine roles an engine's credentials may allow it to register
// (engine.register's role).
const (
	EngineRolePrefill = "prefill"
	EngineRoleDecode  = "decode"
)

// Tags of an engine's user JWT that carry what it may register. NATS
// lowercases tags, so the model (case-sensitive) is hex-encoded.
const (
	tagEngineRole = "connex-engine-role:"
	tagModel      = "connex-model:"
)

// EngineLimits are the NATS limits of an engine's connection (instead of
// the unlimited -1): an engine needs a handful of subscriptions (its
// notices, its reply inbox) and sends requests bounded by connexd's
// max_request_bytes (256 KiB by default).
var EngineLimits = jwt.NatsLimits{
	Subs:    256,     // subscriptions per connection
	Payload: 1 << 20, // bytes per message: a prompt of 256 KiB with room to spare
	Data:    1 << 30, // bytes buffered for the connection (the server applies it to leaf nodes, not to clients)
}

// ErrNotAllowed means an engine's credentials do not allow what it asked to
// register.
var ErrNotAllowed = errors.New("auth: not allowed by the engine's credentials")

// engineTags are the tags that carry id's EngineRole and Model.
func (id Identity) engineTags() []string {
	var tags []string
	if id.EngineRole != "" {
		tags = append(tags, tagEngineRole+id.EngineRole)
	}
	if id.Model != "" {
		tags = append(tags, tagModel+hex.EncodeToString([]byte(id.Model)))
	}
	return tags
}

// IdentityOf reads the identity a user JWT speaks for: its name
// ("engine:<m>/<e>", "member:<m>", "admin") and, for an engine, the role
// and model its tags allow. ok is false for a JWT that names no identity.
func IdentityOf(uc *jwt.UserClaims) (id Identity, ok bool) {
	switch {
	case uc.Name == RoleAdmin:
		id.Role = RoleAdmin
	case strings.HasPrefix(uc.Name, "member:"):
		id.Role, id.Member = RoleMember, strings.TrimPrefix(uc.Name, "member:")
	case strings.HasPrefix(uc.Name, "engine:"):
		m, e, found := strings.Cut(strings.TrimPrefix(uc.Name, "engine:"), "/")
		if !found {
			return Identity{}, false
		}
		id.Role, id.Member, id.Engine = RoleEngine, m, e
	default:
		return Identity{}, false
	}
	for _, t := range uc.Tags {
		switch {
		case strings.HasPrefix(t, tagEngineRole):
			id.EngineRole = strings.TrimPrefix(t, tagEngineRole)
		case strings.HasPrefix(t, tagModel):
			if b, err := hex.DecodeString(strings.TrimPrefix(t, tagModel)); err == nil {
				id.Model = string(b)
			}
		}
	}
	return id, id.Validate() == nil
}

// MayRegister reports whether an engine identity's credentials allow it to
// register with role and model: an EngineRole or Model left empty when the
// credentials were minted allows any (credentials minted before they
// existed keep working; README says to mint them with both).
func (id Identity) MayRegister(role, model string) error {
	if id.Role != RoleEngine {
		return fmt.Errorf("%w: %s is not an engine identity", ErrNotAllowed, id.Name())
	}
	if id.EngineRole != "" && role != id.EngineRole {
		return fmt.Errorf("%w: %s may register as %s, not %s", ErrNotAllowed, id.Name(), id.EngineRole, role)
	}
	if id.Model != "" && model != id.Model {
		return fmt.Errorf("%w: %s may register model %q only", ErrNotAllowed, id.Name(), id.Model)
	}
	return nil
}
