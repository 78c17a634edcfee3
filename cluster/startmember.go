package cluster

import (
	"fmt"

	actorcluster "github.com/asynkron/protoactor-go/cluster"
)

// StartMember joins the cluster as a member: it runs c.StartMember, whose
// cluster provider must be p, and returns once p has joined (its first
// heartbeat sent, the others' being read), or with the error that stopped
// the start. protoactor's StartMember then sleeps a fixed second before it
// returns, and panics where the provider or its remote server fails;
// StartMember leaves that second to a goroutine of its own, so a connexd
// is ready a second sooner, and turns the panic into an error.
//
// After an error the cluster is half started: shut p and the actor system
// down and start anew (a new ActorSystem, a new Provider).
func StartMember(c *actorcluster.Cluster, p *Provider) error {
	panicked := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				panicked <- fmt.Errorf("cluster: start member: %v", r)
			}
		}()
		c.StartMember()
	}()
	select {
	case err := <-p.memberStarted:
		if err != nil {
			return fmt.Errorf("cluster: start member: %w", err)
		}
		return nil
	case err := <-panicked:
		return err
	}
}
