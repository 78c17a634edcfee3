package actors

import (
	"github.com/asynkron/protoactor-go/actor"
)

// HoldTable is the supervisor of hold actors. It spawns one child per
// CreateHold and forwards the request to it, so the child answers the
// original caller. A child that panics is stopped, never restarted: a
// restarted actor would lose the registration it owns, so its Stopping
// handler frees everything instead.
type HoldTable struct {
	deps *HoldDeps
}

// HoldTableProps returns the props of the hold supervisor.
func HoldTableProps(deps *HoldDeps) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &HoldTable{deps: deps} }, actor.WithSupervisor(HoldTableSupervisor()))
}

func stopOnFailure(reason interface{}) actor.Directive { return actor.StopDirective }

// Receive implements actor.Actor.
func (t *HoldTable) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *CreateHold:
		props := actor.PropsFromProducer(func() actor.Actor { return newHoldActor(t.deps) })
		child, err := ctx.SpawnNamed(props, "hold-"+m.ID)
		if err != nil {
			if m.ReleaseRegion != nil {
				m.ReleaseRegion()
			}
			ctx.Respond(Reply{Err: err})
			return
		}
		ctx.Forward(child)
	}
}

// HoldTableSupervisor is the strategy HoldTable applies to its children.
func HoldTableSupervisor() actor.SupervisorStrategy {
	return actor.NewOneForOneStrategy(0, 0, stopOnFailure)
}
