package daemon

import (
	"context"

	"github.com/connex/connex/api"
)

// requireToken refuses a field that cannot be a subject token (bad_request).
func requireToken(field, v string) error {
	if !api.ValidToken(v) {
		return api.Errorf(api.CodeBadRequest, "%s=%q: must be 1-128 bytes of printable UTF-8 without spaces, control characters, '.', '*' or '>'", field, v)
	}
	return nil
}

// engineCall checks an engine-scoped call: under NATS authentication the
// caller's own engine replaces *engineID (acting), and the id must be a
// valid subject token.
func engineCall(ctx context.Context, engineID *string) error {
	if err := acting(ctx, "engine_id", engineID); err != nil {
		return err
	}
	return requireToken("engine_id", *engineID)
}

// engineRegionCall is engineCall for a call about one of the engine's
// regions: regionID must be a valid subject token too.
func engineRegionCall(ctx context.Context, engineID *string, regionID string) error {
	if err := engineCall(ctx, engineID); err != nil {
		return err
	}
	return requireToken("region_id", regionID)
}
