package cluster

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	actorcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/nats-io/nats.go"
)

// A provider that refuses to start (protoactor panics on that) makes
// StartMember return the provider's error instead of crashing.
func TestStartMemberReturnsTheProvidersError(t *testing.T) {
	skipUnderRace(t)
	s := runNATS(t)
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cfg := DefaultLocalConfig()
	cfg.Logger = quiet()
	p, err := NewProvider(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return quiet() }))
	c := actorcluster.New(sys, ActorClusterConfig("not a token", p, disthash.New(), NewRemoteConfig("127.0.0.1", 0, RemoteOptions{})))
	err = StartMember(c, p)
	if err == nil || !strings.Contains(err.Error(), "not a NATS subject token") {
		t.Fatalf("StartMember with an invalid cluster name: %v, want the provider's refusal", err)
	}
	if !sys.IsStopped() {
		t.Fatal("a failed StartMember left the actor system running")
	}
}
