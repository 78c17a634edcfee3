package natsbus

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/auth"
	"github.com/connex/connex/harness/poll"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestEmbeddedServerTrustsTheAuthority: with an Authority the embedded
// server refuses clients without credentials, accepts the authority's
// member credentials with JetStream working (the request bucket), and
// enforces their permissions.
func TestEmbeddedServerTrustsTheAuthority(t *testing.T) {
	a, err := auth.Open(filepath.Join(t.TempDir(), "auth"), true)
	if err != nil {
		t.Fatal(err)
	}
	me := auth.Identity{Role: auth.RoleMember, Member: "m1"}
	creds, err := a.Creds(me, 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(Options{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Name: "m1", Authority: a, Creds: creds, InboxPrefix: me.InboxPrefix()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if nc, err := nats.Connect(b.URL); err == nil || !strings.Contains(err.Error(), "Authorization Violation") {
		if nc != nil {
			nc.Close()
		}
		t.Fatalf("a client without credentials: %v, want an authorization violation", err)
	}
	js, err := jetstream.New(b.Conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "connex_requests"})
	if err != nil {
		t.Fatalf("JetStream with member credentials: %v", err)
	}
	if _, err := kv.Put(ctx, "r1", []byte("x")); err != nil {
		t.Fatal(err)
	}
	sub, err := b.Conn.SubscribeSync("connex.v1.m2.peer.descriptors")
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.AutoUnsubscribe(1); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, time.Millisecond, func() error {
		if err := b.Conn.Flush(); err != nil {
			t.Fatal(err)
		}
		if le := b.Conn.LastError(); le == nil || !strings.Contains(le.Error(), "connex.v1.m2.peer.descriptors") {
			return fmt.Errorf("member m1 subscribing to m2's API: last error %v, want a permissions violation", le)
		}
		return nil
	})
}
