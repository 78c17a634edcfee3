package natsbus

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/connex/connex/auth"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Defaults of the connection limits (Options.MaxConnections,
// Options.EngineConnections).
const (
	// DefaultMaxConnections bounds the embedded server's client
	// connections, well under a process's usual descriptor limit: the
	// router shares its process with the server.
	DefaultMaxConnections = 4096
	// DefaultEngineConnections bounds one engine identity's connections: a
	// shim needs one, the vLLM connector one per process (scheduler and
	// each worker rank).
	DefaultEngineConnections = 32
)

// engineShare is the part of the server's connections that engines
// together may hold (three quarters): the rest stays for members, admins
// and handshakes in progress, so no number of engines starves connexd.
func engineShare(maxConns int) int { return maxConns - maxConns/4 }

// connLimiter closes engine connections over their limits on an embedded
// server (connTable decides), as the server's connect events announce
// them. It listens with the system account's credentials, in-process.
type connLimiter struct {
	srv     *server.Server
	nc      *nats.Conn
	log     *slog.Logger
	mu      sync.Mutex
	table   *connTable
	refused atomic.Uint64
	logged  time.Time // last refusal logged (at most one a second)
}

// startConnLimiter subscribes to the account's connect and disconnect
// events on srv. One subscription carries both, so they arrive in order.
func startConnLimiter(srv *server.Server, a *auth.Authority, perEngine, maxConns int, log *slog.Logger) (*connLimiter, error) {
	creds, err := a.SystemCreds()
	if err != nil {
		return nil, fmt.Errorf("bus: engine connection limits: %w", err)
	}
	tok, seed, _, err := auth.ParseCreds(creds)
	if err != nil {
		return nil, fmt.Errorf("bus: engine connection limits: %w", err)
	}
	l := &connLimiter{srv: srv, log: log, table: newConnTable(perEngine, engineShare(maxConns))}
	nc, err := nats.Connect("", nats.InProcessServer(srv), nats.UserJWTAndSeed(tok, seed), nats.Name("connexd-conn-limits"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("bus: engine connection limits: connect to the system account: %w", err)
	}
	sub, err := nc.Subscribe("$SYS.ACCOUNT."+a.AccountPublicKey()+".*", l.event)
	if err == nil {
		// A flood must not make the events slow-consumer drops: a lost
		// connect is a connection not counted, until the next prune.
		err = sub.SetPendingLimits(1<<20, 256<<20)
	}
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("bus: engine connection limits: subscribe to connect events: %w", err)
	}
	l.nc = nc
	return l, nil
}

// connEvent is the part of a connect or disconnect event the limiter reads.
type connEvent struct {
	Server struct {
		ID string `json:"id"`
	} `json:"server"`
	Client struct {
		ID  uint64 `json:"id"`
		JWT string `json:"jwt"`
	} `json:"client"`
}

func (l *connLimiter) event(m *nats.Msg) {
	kind := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	if kind != "CONNECT" && kind != "DISCONNECT" {
		return
	}
	var ev connEvent
	if err := json.Unmarshal(m.Data, &ev); err != nil || ev.Server.ID != l.srv.ID() || ev.Client.JWT == "" {
		return // another server's client: that server bounds it
	}
	uc, err := jwt.DecodeUserClaims(ev.Client.JWT)
	if err != nil {
		return
	}
	id, ok := auth.IdentityOf(uc)
	if !ok || id.Role != auth.RoleEngine {
		return // members and admins are not bounded here
	}
	name := id.Name()
	l.mu.Lock()
	defer l.mu.Unlock()
	if kind == "DISCONNECT" {
		l.table.closed(name, ev.Client.ID)
		return
	}
	if err := l.table.admit(name, ev.Client.ID, l.stillOpen); err != nil {
		_ = l.srv.DisconnectClientByID(ev.Client.ID)
		n := l.refused.Add(1)
		if now := time.Now(); now.Sub(l.logged) >= time.Second {
			l.logged = now
			l.log.Warn("engine connection refused: over its limit", "engine", name, "cid", ev.Client.ID, "why", err.Error(), "refused_total", n)
		}
	}
}

// stillOpen asks the server whether connection cid is open.
func (l *connLimiter) stillOpen(cid uint64) bool {
	cz, err := l.srv.Connz(&server.ConnzOptions{CID: cid})
	return err == nil && len(cz.Conns) > 0
}

// engineConns is how many open connections engine identity name holds.
func (l *connLimiter) engineConns(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.table.count(name)
}

func (l *connLimiter) close() {
	if l != nil && l.nc != nil {
		l.nc.Close()
	}
}
