package cluster

import (
	actorcluster "github.com/asynkron/protoactor-go/cluster"
	"google.golang.org/protobuf/types/known/emptypb"
)

// StopMember leaves the cluster gracefully and stops a member started with
// Cluster.StartMember: p announces the leave over NATS (peers drop the
// member at once, not after its TTL), then protoactor's parts stop in the
// order of its graceful Cluster.Shutdown — the "left" gossip key, the actor
// system, the identity lookup, gossip, and the remote server after its
// open streams end.
//
// It is Cluster.Shutdown(true) without that method's unconditional 2 s
// sleep ("to wait ownership transferring complete"). Connex places no
// grains whose ownership could move, and protoactor stops the actor system
// (and with it the gossip loop) before that sleep, so the sleep delays
// every connexd's exit by 2 s and changes nothing a peer sees. p may have
// been shut down already (Provider.Shutdown is idempotent).
func StopMember(c *actorcluster.Cluster, p *Provider) {
	_ = p.Shutdown(true)
	c.Gossip.SetState(actorcluster.GracefullyLeftKey, &emptypb.Empty{})
	c.ActorSystem.Shutdown()
	c.IdentityLookup.Shutdown()
	c.Gossip.Shutdown()
	c.Remote.Shutdown(true)
}
