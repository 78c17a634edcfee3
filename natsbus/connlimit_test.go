package natsbus

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/connex/connex/auth"
	"github.com/connex/connex/harness/poll"
	"github.com/nats-io/nats.go"
)

// openAuthed starts an embedded server trusting a fresh authority, with
// member m1's connection.
func openAuthed(t *testing.T, o Options) (*Bus, *auth.Authority) {
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
	o.Listen, o.DataDir, o.Name, o.Authority, o.Creds, o.InboxPrefix = "127.0.0.1:0", t.TempDir(), "m1", a, creds, me.InboxPrefix()
	b, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b, a
}

// connectAs opens a connection with id's credentials that does not
// reconnect once the server closes it.
func connectAs(t *testing.T, b *Bus, a *auth.Authority, id auth.Identity) (*nats.Conn, error) {
	t.Helper()
	creds, err := a.Creds(id, 0)
	if err != nil {
		t.Fatal(err)
	}
	tok, seed, _, err := auth.ParseCreds(creds)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(b.URL, nats.UserJWTAndSeed(tok, seed), nats.NoReconnect(), nats.CustomInboxPrefix(id.InboxPrefix()))
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, err
}

// TestEngineConnectionsAreBoundedPerEngine: one engine credential opening
// many connections keeps only its limit's worth open (the server closes
// the rest), and another engine and a member still connect and stay
// connected.
func TestEngineConnectionsAreBoundedPerEngine(t *testing.T) {
	const limit, flood = 4, 60
	b, a := openAuthed(t, Options{EngineConnections: limit})
	thief := auth.Identity{Role: auth.RoleEngine, Member: "m1", Engine: "e1"}
	var conns []*nats.Conn
	for i := 0; i < flood; i++ {
		nc, err := connectAs(t, b, a, thief)
		if err != nil {
			continue // closed before its handshake ended: refused as well
		}
		conns = append(conns, nc)
	}
	connected := func(cs []*nats.Conn) int {
		n := 0
		for _, c := range cs {
			if c.IsConnected() {
				n++
			}
		}
		return n
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := connected(conns); n != limit {
			return fmt.Errorf("e1 holds %d connections, want %d", n, limit)
		}
		return nil
	})
	if got := b.limiter.engineConns(thief.Name()); got != limit {
		t.Fatalf("the limiter counts %d connections of e1, want %d", got, limit)
	}
	if b.EngineConnsRefused() < flood-limit {
		t.Fatalf("refused %d connections, want at least %d", b.EngineConnsRefused(), flood-limit)
	}
	other, err := connectAs(t, b, a, auth.Identity{Role: auth.RoleEngine, Member: "m1", Engine: "e2"})
	if err != nil {
		t.Fatalf("another engine while e1 floods: %v", err)
	}
	member, err := connectAs(t, b, a, auth.Identity{Role: auth.RoleMember, Member: "m2"})
	if err != nil {
		t.Fatalf("a member while e1 floods: %v", err)
	}
	// Each round is a round trip through the server for each of the three
	// (a Flush waits for the server's PONG), so a close the limiter sends
	// them is seen by the next round, with no sleep between.
	for i := 0; i < 20; i++ {
		errs := errors.Join(other.Flush(), member.Flush(), b.Conn.Flush())
		if errs != nil || !other.IsConnected() || !member.IsConnected() || !b.Conn.IsConnected() {
			t.Fatalf("round %d: e2 connected %v, m2 connected %v, connexd connected %v (%v)", i, other.IsConnected(), member.IsConnected(), b.Conn.IsConnected(), errs)
		}
	}
	// The connections e1 closes give their places back.
	for _, c := range conns {
		c.Close()
	}
	poll.Until(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := b.limiter.engineConns(thief.Name()); n != 0 {
			return fmt.Errorf("e1 still counted with %d connections", n)
		}
		return nil
	})
	if _, err := connectAs(t, b, a, thief); err != nil {
		t.Fatalf("e1 after closing its connections: %v", err)
	}
}

// TestConnectionLimitsHaveDefaults: with no limits configured the server
// still bounds its connections and each engine's.
func TestConnectionLimitsHaveDefaults(t *testing.T) {
	b, _ := openAuthed(t, Options{})
	vz, err := b.Server.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	if vz.MaxConn <= 0 || vz.MaxConn > DefaultMaxConnections {
		t.Fatalf("max_connections %d, want 1..%d", vz.MaxConn, DefaultMaxConnections)
	}
	if b.limiter == nil || b.limiter.table.perEngine != DefaultEngineConnections || b.limiter.table.engines != engineShare(vz.MaxConn) {
		t.Fatalf("engine limits %+v, want %d per engine and %d in all", b.limiter, DefaultEngineConnections, engineShare(vz.MaxConn))
	}
	if _, err := maxConnections(-1, nil); err == nil {
		t.Fatal("a negative nats_max_connections was accepted")
	}
}
