package cluster

import (
	"time"

	actorcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/remote"
)

// GossipInterval is how often protoactor's own gossip runs in a Connex
// member (protoactor's default is 300 ms). Connex decides membership
// itself (Provider) and places no grains, so protoactor's gossip only
// blocks a member whose gossip heartbeat is older than its
// HeartbeatExpiration (20 s) or that left gracefully, both long after the
// Provider has removed it. At 300 ms every member sent a gossip request
// to three others and answered three: about a quarter of an idle
// connexd's CPU. Every 2 s keeps the expiration 10 intervals away; with
// idle heartbeats (Config.IdleHeartbeatInterval) a gossip round a second
// was a third of what an idle router's members cost it.
const GossipInterval = 2 * time.Second

// ActorClusterConfig is protoactor's cluster configuration for a Connex
// member: actorcluster.Configure with the provider, the identity lookup
// and the remote configuration given, and gossip at GossipInterval.
func ActorClusterConfig(name string, p *Provider, lookup actorcluster.IdentityLookup, rc *remote.Config, opts ...actorcluster.ConfigOption) *actorcluster.Config {
	c := actorcluster.Configure(name, p, lookup, rc, opts...)
	c.GossipInterval = GossipInterval
	return c
}
