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
// before that sleep; at most one more gossip round (every GossipInterval)
// could carry the "left" key during it, and the others have learnt of the
// leave over NATS already. So the sleep only delayed every connexd's exit
// by 2 s. p may have been shut down already (Provider.Shutdown is
// idempotent); c must have started (StartMember without error), and
// StopMember is called once: protoactor's parts panic when stopped twice.
func StopMember(c *actorcluster.Cluster, p *Provider) {
	_ = p.Shutdown(true)
	c.Gossip.SetState(actorcluster.GracefullyLeftKey, &emptypb.Empty{})
	c.ActorSystem.Shutdown()
	c.IdentityLookup.Shutdown()
	c.Gossip.Shutdown()
	c.Remote.Shutdown(true)
}
