package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/connex/connex/advertise"
	"github.com/connex/connex/api"
	"github.com/connex/connex/auth"
	"github.com/connex/connex/clock"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
)

// accountConnz is the NATS server's CONNZ of the caller's own account (every
// account imports it from the system account): the connections and, with
// "auth", the user JWTs the server verified when they connected.
const accountConnz = "$SYS.REQ.ACCOUNT.PING.CONNZ"

// connzPage bounds one CONNZ answer; connexd pages through more.
const connzPage = 1024

// engineCreds checks engines' registrations against the credentials the
// NATS server verified for their connections (credChecker).
type engineCreds struct {
	nc     *nats.Conn
	member string
	clock  clock.Clock
	mu     sync.Mutex
	// checks are the engines' credentials last checked against their
	// registrations.
	checks map[string]advertise.CredCheck
}

var _ credChecker = (*engineCreds)(nil)

// check refuses a registration of engine with role and model
// that its credentials do not allow. connexd cannot see who published a
// message, so it asks the NATS server for the identities of the
// connections that speak for engine on this member (user JWTs the server
// verified, named "engine:<member>/<engine>"): every one of them must
// allow role and model. A check stands for advertise.CredCheckTTL.
func (c *engineCreds) check(ctx context.Context, engine, role, model string) error {
	now := c.clock.Now()
	c.mu.Lock()
	fresh := c.checks[engine].Fresh(role, model, now)
	c.mu.Unlock()
	if fresh {
		return nil
	}
	ids, err := c.engineIdentities(ctx, engine)
	if err != nil {
		return api.Errorf(api.CodePeerUnavailable, "engine.register of %s: the NATS server did not say which credentials it holds: %v", engine, err)
	}
	if len(ids) == 0 {
		return api.Errorf(api.CodeForbidden, "engine.register of %s: no connection with engine credentials for it (engine:%s/%s) is open", engine, c.member, engine)
	}
	for _, id := range ids {
		if err := id.MayRegister(role, model); err != nil {
			return api.Errorf(api.CodeForbidden, "engine.register: %v", err)
		}
	}
	c.mu.Lock()
	if c.checks == nil {
		c.checks = map[string]advertise.CredCheck{}
	}
	c.checks[engine] = advertise.CredCheck{Role: role, Model: model, At: now}
	c.mu.Unlock()
	return nil
}

// forget drops engine's credential check (engine.gone).
func (c *engineCreds) forget(engine string) {
	c.mu.Lock()
	delete(c.checks, engine)
	c.mu.Unlock()
}

// connzReply is the part of a CONNZ answer connexd reads.
type connzReply struct {
	Data *struct {
		Total int `json:"total"`
		Conns []struct {
			JWT string `json:"jwt"`
		} `json:"connections"`
	} `json:"data"`
	Error *struct {
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// engineIdentities lists the identities of the open connections whose
// user JWT names engine on this member.
func (c *engineCreds) engineIdentities(ctx context.Context, engine string) ([]auth.Identity, error) {
	var out []auth.Identity
	for offset := 0; ; offset += connzPage {
		req, _ := json.Marshal(map[string]any{"auth": true, "offset": offset, "limit": connzPage})
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		msg, err := c.nc.RequestWithContext(cctx, accountConnz, req)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", accountConnz, err)
		}
		var rep connzReply
		if err := json.Unmarshal(msg.Data, &rep); err != nil {
			return nil, fmt.Errorf("%s: %w", accountConnz, err)
		}
		if rep.Error != nil {
			return nil, fmt.Errorf("%s: %d %s", accountConnz, rep.Error.Code, rep.Error.Description)
		}
		if rep.Data == nil {
			return nil, fmt.Errorf("%s: no data", accountConnz)
		}
		for _, conn := range rep.Data.Conns {
			uc, err := jwt.DecodeUserClaims(conn.JWT)
			if err != nil {
				continue // not a JWT user (this account has none)
			}
			id, ok := auth.IdentityOf(uc)
			if ok && id.Role == auth.RoleEngine && id.Member == c.member && id.Engine == engine {
				out = append(out, id)
			}
		}
		if len(rep.Data.Conns) < connzPage || offset+connzPage >= rep.Data.Total {
			return out, nil
		}
	}
}
