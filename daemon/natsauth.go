package daemon

import (
	"context"

	"fmt"
	"github.com/connex/connex/api"
	"log/slog"
	"path/filepath"

	"github.com/connex/connex/auth"
	"github.com/connex/connex/config"
	"github.com/connex/connex/natsbus"
)

// openBus connects to NATS with this member's identity. With the embedded
// server and nats_auth on (the default), connexd opens (or creates) the
// authority in auth_dir, makes its server trust it, connects with member
// credentials it mints for itself, and writes admin.creds there for the
// operator's tools. Against an external server it connects with
// nats_creds, if given. It returns the credentials it connected with (nil
// without), from which protoactor's remote makes its TLS identity.
func openBus(cfg config.Config, log *slog.Logger) (*natsbus.Bus, []byte, error) {
	me := auth.Identity{Role: auth.RoleMember, Member: cfg.MemberID}
	o := natsbus.Options{
		URL: cfg.NATSURL, Listen: cfg.NATSListen, DataDir: cfg.DataDir, Name: cfg.MemberID, Logger: log,
		InboxPrefix: me.InboxPrefix(),
		TLSCAFile:   cfg.NATSTLSCA, TLSCertFile: cfg.NATSTLSCert, TLSKeyFile: cfg.NATSTLSKey,
		MaxConnections: cfg.NATSMaxConnections, EngineConnections: cfg.NATSEngineConnections,
	}
	switch {
	case cfg.NATSURL == "" && cfg.NATSAuth:
		a, err := auth.Open(cfg.AuthDir, true)
		if err != nil {
			return nil, nil, fmt.Errorf("nats_auth: %w", err)
		}
		if o.Creds, err = a.Creds(me, 0); err != nil {
			return nil, nil, err
		}
		admin := filepath.Join(cfg.AuthDir, auth.AdminCredsFile)
		if err := a.WriteCreds(admin, auth.Identity{Role: auth.RoleAdmin}, 0); err != nil {
			return nil, nil, err
		}
		o.Authority = a
	case cfg.NATSURL == "":
		log.Warn("NATS AUTHENTICATION IS OFF (nats_auth=off): any process that reaches nats_listen can call every member's API, read every notice and prompt, and write the request bucket; use this for development only", "nats_listen", cfg.NATSListen)
	case cfg.NATSCreds != "":
		creds, err := readMemberCreds(cfg.NATSCreds, log)
		if err != nil {
			return nil, nil, err
		}
		_, _, claims, err := auth.ParseCreds(creds)
		if err != nil {
			return nil, nil, fmt.Errorf("nats_creds=%s: %w", cfg.NATSCreds, err)
		}
		if claims.Name != me.Name() && claims.Name != (auth.Identity{Role: auth.RoleAdmin}).Name() {
			return nil, nil, fmt.Errorf("nats_creds=%s are %q's, not member %s's (mint them with connexd auth creds --role member --member %s)", cfg.NATSCreds, claims.Name, cfg.MemberID, cfg.MemberID)
		}
		if claims.Name == (auth.Identity{Role: auth.RoleAdmin}).Name() {
			o.InboxPrefix = auth.Identity{Role: auth.RoleAdmin}.InboxPrefix()
		}
		o.Creds = creds
	}
	b, err := natsbus.Open(o)
	return b, o.Creds, err
}

// AuthDir is the directory of the authority the embedded server trusts
// (admin.creds is there), or "" when this member runs none.
func (d *Daemon) AuthDir() string {
	if d.cfg.NATSURL == "" && d.cfg.NATSAuth {
		return d.cfg.AuthDir
	}
	return ""
}

// acting replaces *field (a payload's engine_id, requester) with the
// calling engine on an engine-scoped subject, refusing one that names
// another engine (api.ActingEngine).
func acting(ctx context.Context, name string, field *string) error {
	e, err := api.ActingEngine(ctx, name, *field)
	if err != nil {
		return err
	}
	*field = e
	return nil
}

// natsAuthenticated reports whether this member's NATS connection is
// authenticated (the embedded server with nats_auth, or nats_creds for an
// external one): then engines hold their own credentials and connexd checks
// what they may do against them.
func natsAuthenticated(cfg config.Config) bool {
	return (cfg.NATSURL == "" && cfg.NATSAuth) || cfg.NATSCreds != ""
}

// engineInbox is the reply prefix each engine's credentials subscribe to
// (api.ServeOptions.EngineInbox) under NATS authentication; nil without
// it, where any process may publish anywhere anyway.
func engineInbox(cfg config.Config) func(engine string) string {
	if !natsAuthenticated(cfg) {
		return nil
	}
	return func(engine string) string {
		return auth.Identity{Role: auth.RoleEngine, Member: cfg.MemberID, Engine: engine}.InboxPrefix()
	}
}
