package natsbus

import (
	"fmt"

	"github.com/connex/connex/auth"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// trust puts an embedded server in operator mode: it trusts the
// authority's operator and resolves its two accounts from memory, so every
// client must present a user JWT the account key signed, and the server
// enforces the permissions in it.
func trust(opts *server.Options, a *auth.Authority) error {
	_, op, err := a.OperatorJWT()
	if err != nil {
		return err
	}
	accs, err := a.AccountJWTs()
	if err != nil {
		return err
	}
	res := &server.MemAccResolver{}
	for pub, tok := range accs {
		if err := res.Store(pub, tok); err != nil {
			return fmt.Errorf("bus: resolver: %w", err)
		}
	}
	opts.TrustedOperators = append(opts.TrustedOperators, op)
	opts.SystemAccount = a.SystemAccountPublicKey()
	opts.AccountResolver = res
	return nil
}

// clientOptions are the connection's identity and TLS options.
func clientOptions(o Options) ([]nats.Option, error) {
	var opts []nats.Option
	if len(o.Creds) > 0 {
		tok, seed, _, err := auth.ParseCreds(o.Creds)
		if err != nil {
			return nil, fmt.Errorf("bus: %w", err)
		}
		opts = append(opts, nats.UserJWTAndSeed(tok, seed))
	}
	if o.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(o.InboxPrefix))
	}
	if o.TLSCAFile != "" {
		opts = append(opts, nats.RootCAs(o.TLSCAFile))
	}
	if o.TLSCertFile != "" && o.TLSKeyFile != "" && o.URL != "" {
		opts = append(opts, nats.ClientCert(o.TLSCertFile, o.TLSKeyFile))
	}
	return opts, nil
}
