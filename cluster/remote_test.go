package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/connex/connex/auth"
)

// startRemote starts an ActorSystem with a remote on a free loopback port
// and an "echo" actor that answers a StringValue with it; it returns the
// system and the remote's address.
func startRemote(t testing.TB, ro RemoteOptions) (*actor.ActorSystem, string) {
	t.Helper()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	r := remote.NewRemote(sys, NewRemoteConfig("127.0.0.1", 0, ro))
	r.Start()
	t.Cleanup(func() { r.Shutdown(false); sys.Shutdown() })
	if _, err := sys.Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
		if m, ok := c.Message().(*wrapperspb.StringValue); ok {
			c.Respond(m)
		}
	}), "echo"); err != nil {
		t.Fatal(err)
	}
	return sys, sys.Address()
}

// ask sends "hi" to addr's echo actor over the remote and waits for the
// answer.
func ask(from *actor.ActorSystem, addr string, timeout time.Duration) error {
	res, err := from.Root.RequestFuture(actor.NewPID(addr, "echo"), wrapperspb.String("hi"), timeout).Result()
	if err != nil {
		return err
	}
	if s, ok := res.(*wrapperspb.StringValue); !ok || s.GetValue() != "hi" {
		return fmt.Errorf("echo answered %v", res)
	}
	return nil
}

// memberRemote is RemoteOptions with the mutual TLS of fresh member
// credentials of a.
func memberRemote(t testing.TB, a *auth.Authority, member string) RemoteOptions {
	t.Helper()
	creds, err := a.Creds(auth.Identity{Role: auth.RoleMember, Member: member}, 0)
	if err != nil {
		t.Fatal(err)
	}
	s, c, err := auth.MemberTLS(creds)
	if err != nil {
		t.Fatal(err)
	}
	return RemoteOptions{ServerTLS: s, ClientTLS: c, Logger: quiet()}
}

func openAuthority(t testing.TB) *auth.Authority {
	t.Helper()
	a, err := auth.Open(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestRemoteMemberTLS: two members of one authority talk over protoactor's
// remote in mutual TLS (server and dialler both use it); a member of
// another authority and a plaintext member reach neither.
func TestRemoteMemberTLS(t *testing.T) {
	skipUnderRace(t)
	a, other := openAuthority(t), openAuthority(t)
	sys1, addr1 := startRemote(t, memberRemote(t, a, "m1"))
	sys2, addr2 := startRemote(t, memberRemote(t, a, "m2"))
	if err := ask(sys1, addr2, 5*time.Second); err != nil {
		t.Fatalf("m1 → m2 over TLS: %v", err)
	}
	if err := ask(sys2, addr1, 5*time.Second); err != nil {
		t.Fatalf("m2 → m1 over TLS: %v", err)
	}
	stranger, _ := startRemote(t, memberRemote(t, other, "m1"))
	if err := ask(stranger, addr1, time.Second); err == nil {
		t.Fatal("a member of another authority reached m1")
	}
	plain, _ := startRemote(t, RemoteOptions{})
	if err := ask(plain, addr1, time.Second); err == nil {
		t.Fatal("a plaintext peer reached m1")
	}
	// m1 still serves its members.
	if err := ask(sys2, addr1, 5*time.Second); err != nil {
		t.Fatalf("m2 → m1 after the strangers: %v", err)
	}
}

// TestCheckBatch: the batch check accepts what protoactor's own writer
// sends and refuses each index its reader would use unchecked.
func TestCheckBatch(t *testing.T) {
	pid := actor.NewPID("127.0.0.1:1", "x")
	good := func() *remote.MessageBatch {
		return &remote.MessageBatch{
			TypeNames: []string{"google.protobuf.StringValue"},
			Targets:   []*actor.PID{pid},
			Senders:   []*actor.PID{pid},
			Envelopes: []*remote.MessageEnvelope{{Target: 0, Sender: 1, TypeId: 0, SerializerId: 0}, {Target: 0, Sender: 0, SerializerId: 1}},
		}
	}
	if err := checkBatch(good()); err != nil {
		t.Fatalf("good batch: %v", err)
	}
	bad := map[string]func(b *remote.MessageBatch){
		"target past the end": func(b *remote.MessageBatch) { b.Envelopes[0].Target = 1 },
		"negative target":     func(b *remote.MessageBatch) { b.Envelopes[0].Target = -1 },
		"no targets":          func(b *remote.MessageBatch) { b.Targets = nil },
		"nil target":          func(b *remote.MessageBatch) { b.Targets[0] = nil },
		"sender past the end": func(b *remote.MessageBatch) { b.Envelopes[0].Sender = 2 },
		"negative sender":     func(b *remote.MessageBatch) { b.Envelopes[0].Sender = -1 },
		"nil sender":          func(b *remote.MessageBatch) { b.Senders[0] = nil },
		"type past the end":   func(b *remote.MessageBatch) { b.Envelopes[1].TypeId = 1 },
		"negative type":       func(b *remote.MessageBatch) { b.Envelopes[1].TypeId = -3 },
		"unknown serializer":  func(b *remote.MessageBatch) { b.Envelopes[1].SerializerId = 2 },
		"nil envelope":        func(b *remote.MessageBatch) { b.Envelopes[1] = nil },
	}
	for name, mutate := range bad {
		b := good()
		mutate(b)
		if err := checkBatch(b); !errors.Is(err, errBadBatch) {
			t.Errorf("%s: %v, want errBadBatch", name, err)
		}
	}
}

// BenchmarkRemoteTLS measures a request/response round trip between two
// members over protoactor's remote, plaintext and with member TLS (the
// default with auth), interleaved, and prints
// REMOTE plain_us=<a> tls_us=<b> tls_ratio=<b/a> (medians).
func BenchmarkRemoteTLS(b *testing.B) {
	if raceEnabled {
		b.Skip("protoactor-go trips the race detector")
	}
	a := openAuthority(b)
	plainFrom, _ := startRemote(b, RemoteOptions{})
	_, plainTo := startRemote(b, RemoteOptions{})
	tlsFrom, _ := startRemote(b, memberRemote(b, a, "m1"))
	_, tlsTo := startRemote(b, memberRemote(b, a, "m2"))
	// Connect (and handshake) outside the timing.
	for _, p := range [][2]any{{plainFrom, plainTo}, {tlsFrom, tlsTo}} {
		if err := ask(p[0].(*actor.ActorSystem), p[1].(string), 5*time.Second); err != nil {
			b.Fatal(err)
		}
	}
	var plain, secure []time.Duration
	b.ResetTimer()
	for range b.N {
		for i, p := range [][2]any{{plainFrom, plainTo}, {tlsFrom, tlsTo}} {
			start := time.Now()
			if err := ask(p[0].(*actor.ActorSystem), p[1].(string), 5*time.Second); err != nil {
				b.Fatal(err)
			}
			if i == 0 {
				plain = append(plain, time.Since(start))
			} else {
				secure = append(secure, time.Since(start))
			}
		}
	}
	b.StopTimer()
	slices.Sort(plain)
	slices.Sort(secure)
	p50p, p50t := plain[len(plain)/2], secure[len(secure)/2]
	ratio := float64(p50t) / float64(p50p)
	b.ReportMetric(ratio, "tls_ratio")
	fmt.Printf("REMOTE plain_us=%.1f tls_us=%.1f tls_ratio=%.2f\n", float64(p50p.Nanoseconds())/1e3, float64(p50t.Nanoseconds())/1e3, ratio)
}
