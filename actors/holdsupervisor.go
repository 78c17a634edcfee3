package actors

import (
	"github.com/asynkron/protoactor-go/actor"
)

// HoldSupervisor is the supervisor of hold actors. It spawns one child per
// CreateHold and forwards the request to it, so the child answers the
// original caller. A child that panics is stopped, never restarted: a
// restarted actor would lose the registration it owns, so its Stopping
// handler frees everything instead.
type HoldSupervisor struct {
	deps *HoldDeps
	// child is the props of every hold actor, made once: a Props per
	// spawn cost each live hold ~240 bytes (make bench-holds).
	child *actor.Props
}

// HoldSupervisorProps returns the props of the hold supervisor.
func HoldSupervisorProps(deps *HoldDeps) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &HoldSupervisor{deps: deps, child: holdProps(deps)} }, actor.WithSupervisor(HoldSupervisorStrategy()))
}

// holdProps are the props of a hold actor. Its mailbox is protoactor's
// lock-free one: a hold gets a few messages in its life, and the default
// mailbox's ring of 10 slots cost each live hold ~200 bytes more than the
// lock-free queue's stub node (make bench-holds).
func holdProps(deps *HoldDeps) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return newHoldActor(deps) }, actor.WithMailbox(actor.UnboundedLockfree()))
}

func stopOnFailure(reason interface{}) actor.Directive { return actor.StopDirective }

// Receive implements actor.Actor.
func (t *HoldSupervisor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *CreateHold:
		child, err := ctx.SpawnNamed(t.child, "hold-"+m.ID)
		if err != nil {
			if m.ReleaseRegion != nil {
				m.ReleaseRegion()
			}
			if m.ReleaseMoreRanks != nil {
				m.ReleaseMoreRanks()
			}
			ctx.Respond(Reply{Err: err})
			return
		}
		ctx.Forward(child)
	}
}

// HoldSupervisorStrategy is the strategy HoldSupervisor applies to its children.
func HoldSupervisorStrategy() actor.SupervisorStrategy {
	return actor.NewOneForOneStrategy(0, 0, stopOnFailure)
}
