package cluster

import (
	"fmt"

	actorcluster "github.com/asynkron/protoactor-go/cluster"
)

// StartMember joins the cluster as a member: it runs c.StartMember, whose
// cluster provider must be p, and returns once p has joined (subscribed to
// the cluster's subjects, its heartbeat loop started; the others learn of
// it at its first heartbeat, sent at once), or with the error that stopped
// the start. protoactor's StartMember then sleeps a fixed second before it
// returns, and panics where the provider or its remote server fails;
// StartMember leaves that second to a goroutine of its own, so a connexd
// is ready a second sooner, and turns the panic into an error.
//
// After an error StartMember has stopped what the start began (the
// provider, the actor system and, where it started, protoactor's remote
// server): start anew with a new ActorSystem and a new Provider. After
// success, stop the member once with StopMember.
func StartMember(c *actorcluster.Cluster, p *Provider) error {
	ended := make(chan error, 1) // protoactor's StartMember returned or panicked
	go func() {
		defer func() {
			r := recover()
			if r == nil {
				ended <- nil
				return
			}
			if err, ok := r.(error); ok {
				ended <- fmt.Errorf("cluster: start member: %w", err)
			} else {
				ended <- fmt.Errorf("cluster: start member: %v", r)
			}
		}()
		c.StartMember()
	}()
	var err error
	select {
	case err = <-p.memberStarted:
		if err != nil {
			err = fmt.Errorf("cluster: start member: %w", err)
		}
	case err = <-ended:
		if err == nil {
			// Returned without calling p: c's provider is another.
			err = fmt.Errorf("cluster: start member: the cluster's provider is not the one given")
		}
	}
	if err != nil {
		abandon(c, p)
	}
	return err
}

// abandon stops what a failed StartMember began: p, the actor system, and
// protoactor's remote server if it got as far as starting it (its Shutdown
// panics on a server that never started).
func abandon(c *actorcluster.Cluster, p *Provider) {
	_ = p.Shutdown(false)
	c.ActorSystem.Shutdown()
	if c.Remote != nil {
		func() {
			defer func() { _ = recover() }()
			c.Remote.Shutdown(false)
		}()
	}
}
