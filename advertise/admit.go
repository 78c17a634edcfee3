package advertise

import (
	"errors"
	"fmt"
	"time"

	"github.com/connex/connex/messages"
)

// ErrWrongMember means an engine registered with a role its member does not
// host (a decode member's engine claiming to be prefill).
var ErrWrongMember = errors.New("engines: role not hosted by this member")

// CheckRole refuses an engine whose role its member does not host: a
// prefill member hosts prefill engines, a decode member decode engines;
// members of role all (or router) host either.
func CheckRole(role, memberRole string) error {
	switch memberRole {
	case RolePrefill, RoleDecode:
		if role != memberRole {
			return fmt.Errorf("%w: a %s member hosts %s engines, not %s", ErrWrongMember, memberRole, memberRole, role)
		}
	}
	return nil
}

// ClampBlocks bounds an engine's advertised block counts by regionBlocks,
// the blocks of the regions it has on its member (what connexd can check):
// an engine cannot attract placements with blocks it does not have. It
// reports whether it changed anything.
func ClampBlocks(e *messages.EngineInfo, regionBlocks uint32) bool {
	changed := false
	if e.BlocksTotal > regionBlocks {
		e.BlocksTotal, changed = regionBlocks, true
	}
	if e.BlocksFree > e.BlocksTotal {
		e.BlocksFree, changed = e.BlocksTotal, true
	}
	return changed
}

// CredCheckTTL is how long a check of an engine's credentials (the role and
// model they allow) stands before the next registration checks again.
const CredCheckTTL = 30 * time.Second

// CredCheckGrace is how long a passed check still stands when the NATS
// server cannot be asked again (its answer late or lost under load): a
// registration is not lost to a slow server, only to credentials that no
// longer allow it.
const CredCheckGrace = 10 * time.Minute

// CredCheck is the last successful check of an engine's credentials for a
// role and model.
type CredCheck struct {
	Role, Model string
	At          time.Time
}

// Fresh reports whether c still vouches for role and model at now.
func (c CredCheck) Fresh(role, model string, now time.Time) bool {
	return !c.At.IsZero() && c.Role == role && c.Model == model && now.Sub(c.At) < CredCheckTTL
}

// Stands reports whether c still vouches for role and model at now when
// the server could not be asked: a check within CredCheckGrace does.
func (c CredCheck) Stands(role, model string, now time.Time) bool {
	return !c.At.IsZero() && c.Role == role && c.Model == model && now.Sub(c.At) < CredCheckGrace
}
