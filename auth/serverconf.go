package auth

import (
	"fmt"
	"sort"
	"strings"

	"github.com/nats-io/jwt/v2"
)

// ServerConfig renders the part of a nats-server configuration file that
// trusts this authority: the operator, the system account and a memory
// resolver preloaded with both accounts. Add listen, jetstream, cluster
// and tls blocks of your own; every client then needs credentials minted
// by `connexd auth creds`, and each one's permissions travel in its JWT.
func (a *Authority) ServerConfig() (string, error) {
	op, _, err := a.OperatorJWT()
	if err != nil {
		return "", err
	}
	accs, err := a.AccountJWTs()
	if err != nil {
		return "", err
	}
	keys := make([]string, 0, len(accs))
	for k := range accs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "# Trust in the Connex authority of %s (connexd auth server-config).\n", a.Dir)
	fmt.Fprintf(&b, "# Accounts: %s (every Connex identity, JetStream on) = %s; %s = %s.\n", AccountName, a.AccountPublicKey(), SystemAccountName, a.SystemAccountPublicKey())
	b.WriteString("# Users are not listed here: each credentials file carries its signed permissions.\n")
	fmt.Fprintf(&b, "operator: %s\n", op)
	fmt.Fprintf(&b, "system_account: %s\n", a.SystemAccountPublicKey())
	b.WriteString("resolver: MEMORY\nresolver_preload: {\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s: %s\n", k, accs[k])
	}
	b.WriteString("}\n")
	return b.String(), nil
}

// ParseCreds splits a credentials file into its user JWT and seed, and
// returns the JWT's claims (name, permissions, expiry) for checks and logs.
func ParseCreds(creds []byte) (token, seed string, claims *jwt.UserClaims, err error) {
	token, err = jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return "", "", nil, fmt.Errorf("auth: credentials: %w", err)
	}
	kp, err := jwt.ParseDecoratedNKey(creds)
	if err != nil {
		return "", "", nil, fmt.Errorf("auth: credentials: %w", err)
	}
	s, err := kp.Seed()
	if err != nil {
		return "", "", nil, fmt.Errorf("auth: credentials seed: %w", err)
	}
	claims, err = jwt.DecodeUserClaims(token)
	if err != nil {
		return "", "", nil, fmt.Errorf("auth: credentials JWT: %w", err)
	}
	return token, string(s), claims, nil
}
