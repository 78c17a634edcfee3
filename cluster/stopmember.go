package cluster

import (
	actorcluster "github.com/asynkron/protoactor-go/cluster"
)

// StopMember leaves the cluster gracefully and stops a member started with
// Cluster.StartMember: p announces the leave over NATS (peers drop the
// member at once, not after its TTL), then protoactor's parts stop in the
// order of its graceful Cluster.Shutdown — the actor system, the identity
// lookup, gossip, and the remote server after its open streams end.
//
// protoactor's own "left" gossip key is not set: a peer whose gossip
// carried it before the NATS leave reached it would block the member on
// its own, and record a "blocked" departure for a graceful leave. The
// NATS leave (and p's "left" answer to probes) tells every peer.
//
// Nor does it sleep 2 s as Cluster.Shutdown(true) does ("to wait ownership
// transferring complete"): Connex places no grains whose ownership could
// move, protoactor stops the actor system before that sleep, and the
// others have learnt of the leave over NATS already, so the sleep only
// delayed every connexd's exit by 2 s. p may have been shut down already (Provider.Shutdown is
// idempotent); c must have started (StartMember without error), and
// StopMember is called once: protoactor's parts panic when stopped twice.
func StopMember(c *actorcluster.Cluster, p *Provider) {
	_ = p.Shutdown(true)
	c.ActorSystem.Shutdown()
	c.IdentityLookup.Shutdown()
	c.Gossip.Shutdown()
	c.Remote.Shutdown(true)
}
