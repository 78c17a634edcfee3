// Package auth gives every process on the Connex bus a NATS identity and
// the permissions of its role, enforced by the NATS server itself.
//
// Connex uses NATS's decentralised authentication: an operator key signs
// one account ("CONNEX", with JetStream) and a system account; the
// account key signs one user JWT per identity, and each JWT carries the
// publish and subscribe permissions of its role (identity.go). The server
// checks the JWT's signature chain and enforces the permissions; connexd
// only reads who called from the subject, which the server let that caller
// publish on (connex.v1.<member>.e.<engine>.<endpoint> for engines).
//
// An Authority (authority.go) is the directory holding the operator,
// account and system keys (0600 files in a 0700 directory). An embedded
// server is configured from it (bus), `connexd auth creds` mints credentials
// files from it, and `connexd auth server-config` prints the nats-server
// configuration that trusts it (serverconf.go).
package auth
