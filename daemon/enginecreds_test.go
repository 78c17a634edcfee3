package daemon

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/connex/connex/advertise"
	"github.com/connex/connex/api"
	"github.com/connex/connex/auth"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/natsbus"
	"github.com/nats-io/nats.go"
)

// credsBus starts an embedded server trusting a fresh authority, with
// member m1's connection, and returns a way to connect as anyone.
func credsBus(t *testing.T) (*natsbus.Bus, func(id auth.Identity) *nats.Conn) {
	t.Helper()
	a, err := auth.Open(filepath.Join(t.TempDir(), "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	me := auth.Identity{Role: auth.RoleMember, Member: "m1"}
	creds, err := a.Creds(me, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := natsbus.Open(natsbus.Options{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Name: "m1", Authority: a, Creds: creds,
		InboxPrefix: me.InboxPrefix(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b, func(id auth.Identity) *nats.Conn {
		t.Helper()
		c, err := a.Creds(id, 0)
		if err != nil {
			t.Fatal(err)
		}
		tok, seed, _, err := auth.ParseCreds(c)
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(b.URL, nats.UserJWTAndSeed(tok, seed), nats.CustomInboxPrefix(id.InboxPrefix()))
		if err != nil {
			t.Fatalf("connect as %s: %v", id.Name(), err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}

// TestEngineCredsCheckAsksAboutThatEngine: the credential check reads the
// engine's own connections (those on its inbox), not every connection of
// the account: hundreds of other connections cost it nothing, and another
// engine's connections, however many, do not enter its verdict.
func TestEngineCredsCheckAsksAboutThatEngine(t *testing.T) {
	b, connect := credsBus(t)
	e1 := auth.Identity{Role: auth.RoleEngine, Member: "m1", Engine: "e1", EngineRole: auth.EngineRoleDecode, Model: "m"}
	for _, nc := range []*nats.Conn{connect(e1), connect(e1)} {
		if _, err := nc.SubscribeSync(e1.InboxPrefix() + ".resp.*"); err != nil { // what a request's reply needs
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	const others = 150
	for i := 0; i < others; i++ {
		connect(auth.Identity{Role: auth.RoleAdmin})
	}
	// e2 may register as prefill only: its connections never make e1's
	// check refuse.
	for i := 0; i < 8; i++ {
		connect(auth.Identity{Role: auth.RoleEngine, Member: "m1", Engine: "e2", EngineRole: auth.EngineRolePrefill})
	}
	c := &engineCreds{nc: b.Conn, member: "m1", clock: clock.NewFake(time.Unix(1000, 0))}
	ids, read, err := c.engineIdentities(context.Background(), "e1")
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || read > 2 {
		t.Fatalf("the check of e1 found %d identities reading %d connections, want 2 of 2 (the account holds %d more)", len(ids), read, others+8)
	}
	if err := c.check(context.Background(), "e1", auth.EngineRoleDecode, "m"); err != nil {
		t.Fatalf("e1 registering as its credentials allow: %v", err)
	}
	wantCode(t, "e1 registering as prefill", c.check(context.Background(), "e1", auth.EngineRolePrefill, "m"), api.CodeForbidden)
}

// TestEngineCredsCheckOutlivesASlowServer: a check that passed stands when
// the server cannot be asked again, for advertise.CredCheckGrace, and only
// for the role and model it passed.
func TestEngineCredsCheckOutlivesASlowServer(t *testing.T) {
	b, connect := credsBus(t)
	e1 := auth.Identity{Role: auth.RoleEngine, Member: "m1", Engine: "e1", EngineRole: auth.EngineRoleDecode}
	nc := connect(e1)
	if _, err := nc.SubscribeSync(e1.InboxPrefix() + ".resp.*"); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Unix(1000, 0))
	c := &engineCreds{nc: b.Conn, member: "m1", clock: clk}
	if err := c.check(context.Background(), "e1", auth.EngineRoleDecode, "m"); err != nil {
		t.Fatal(err)
	}
	// The server stops answering (the member's connection is gone).
	b.Conn.Close()
	clk.Advance(advertise.CredCheckTTL + time.Second)
	if err := c.check(context.Background(), "e1", auth.EngineRoleDecode, "m"); err != nil {
		t.Fatalf("a renewal after the check's TTL, the server silent: %v, want the passed check to stand", err)
	}
	wantCode(t, "another model while the server is silent", c.check(context.Background(), "e1", auth.EngineRoleDecode, "other"), api.CodePeerUnavailable)
	clk.Advance(advertise.CredCheckGrace)
	wantCode(t, "a renewal past the grace, the server silent", c.check(context.Background(), "e1", auth.EngineRoleDecode, "m"), api.CodePeerUnavailable)
}
