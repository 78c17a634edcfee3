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

// connzPage bounds one CONNZ answer; connexd pages through more (an
// engine holds at most nats_engine_connections on the embedded server).
const connzPage = 256

// connzMax bounds the connections one check reads: more for one engine
// (possible only on an external server, which bounds none per engine) fail
// the check rather than page on.
const connzMax = 4 * connzPage

// connzTimeout bounds one CONNZ question.
const connzTimeout = 2 * time.Second

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
// allow role and model. A check stands for advertise.CredCheckTTL; when
// the server cannot answer the next one, a passed check stands for
// advertise.CredCheckGrace, so a flooded server does not unregister
// engines.
func (c *engineCreds) check(ctx context.Context, engine, role, model string) error {
	now := c.clock.Now()
	c.mu.Lock()
	last := c.checks[engine]
	c.mu.Unlock()
	if last.Fresh(role, model, now) {
		return nil
	}
	ids, _, err := c.engineIdentities(ctx, engine)
	if err != nil {
		if last.Stands(role, model, now) {
			return nil
		}
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
// user JWT names engine on this member. It asks the server only about the
// connections subscribed to the engine's inbox: an engine's request
// (engine.register) always is, and only the engine's credentials (and an
// admin's) may subscribe there, so the answer is the engine's own handful
// of connections, however many others the account holds. read is how many
// connections the server described.
func (c *engineCreds) engineIdentities(ctx context.Context, engine string) (ids []auth.Identity, read int, err error) {
	inbox := auth.Identity{Role: auth.RoleEngine, Member: c.member, Engine: engine}.InboxPrefix() + ".>"
	for offset := 0; ; offset += connzPage {
		req, _ := json.Marshal(map[string]any{"auth": true, "offset": offset, "limit": connzPage, "filter_subject": inbox})
		cctx, cancel := context.WithTimeout(ctx, connzTimeout)
		msg, err := c.nc.RequestWithContext(cctx, accountConnz, req)
		cancel()
		if err != nil {
			return nil, read, fmt.Errorf("%s: %w", accountConnz, err)
		}
		var rep connzReply
		if err := json.Unmarshal(msg.Data, &rep); err != nil {
			return nil, read, fmt.Errorf("%s: %w", accountConnz, err)
		}
		if rep.Error != nil {
			return nil, read, fmt.Errorf("%s: %d %s", accountConnz, rep.Error.Code, rep.Error.Description)
		}
		if rep.Data == nil {
			return nil, read, fmt.Errorf("%s: no data", accountConnz)
		}
		read += len(rep.Data.Conns)
		for _, conn := range rep.Data.Conns {
			uc, err := jwt.DecodeUserClaims(conn.JWT)
			if err != nil {
				continue // not a JWT user (this account has none)
			}
			id, ok := auth.IdentityOf(uc)
			if ok && id.Role == auth.RoleEngine && id.Member == c.member && id.Engine == engine {
				ids = append(ids, id)
			}
		}
		if len(rep.Data.Conns) < connzPage || offset+connzPage >= rep.Data.Total {
			return ids, read, nil
		}
		if offset+connzPage >= connzMax {
			return nil, read, fmt.Errorf("more than %d connections speak for engine %s", connzMax, engine)
		}
	}
}
