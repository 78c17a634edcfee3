package daemon

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
)

// systemHolds is holdActors on the daemon's actor system: table is the
// hold supervisor actor that creates holds.
type systemHolds struct {
	sys   *actor.ActorSystem
	table *actor.PID
}

var _ holdActors = systemHolds{}

func (s systemHolds) create(msg *actors.CreateHold) (actors.Reply, error) { return s.ask(s.table, msg) }

// ask sends a message to an actor and waits for its Reply.
func (s systemHolds) ask(pid *actor.PID, msg any) (actors.Reply, error) {
	res, err := s.sys.Root.RequestFuture(pid, msg, askTimeout).Result()
	if err != nil {
		return actors.Reply{}, err
	}
	rep, ok := res.(actors.Reply)
	if !ok {
		return actors.Reply{}, api.Errorf(api.CodeInternal, "unexpected reply %T", res)
	}
	return rep, rep.Err
}

func (s systemHolds) tell(pid *actor.PID, msg any, f func(rep actors.Reply, dead bool)) error {
	return tell(s.sys, pid, msg, f)
}
