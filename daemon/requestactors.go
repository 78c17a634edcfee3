package daemon

import (
	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// systemRequests is requestActors on the daemon's actor system.
type systemRequests struct {
	sys   *actor.ActorSystem
	table *actors.RequestTable
	deps  *actors.RequestDeps
}

var _ requestActors = systemRequests{}

func (s systemRequests) lookup(id string) (*actor.PID, bool) { return s.table.Lookup(id) }
func (s systemRequests) running() int                        { return s.table.Len() }
func (s systemRequests) all() []*actor.PID                   { return s.table.All() }
func (s systemRequests) send(pid *actor.PID, msg any)        { s.sys.Root.Send(pid, msg) }

func (s systemRequests) ask(pid *actor.PID, msg any) (*messages.RequestStatus, error) {
	res, err := s.sys.Root.RequestFuture(pid, msg, askTimeout).Result()
	if err != nil {
		return nil, err
	}
	rep, ok := res.(actors.RequestReply)
	if !ok {
		return nil, api.Errorf(api.CodeInternal, "unexpected reply %T from a request actor", res)
	}
	return rep.Status, rep.Err
}

func (s systemRequests) spawn(first any) (*messages.RequestStatus, error) {
	return s.ask(s.sys.Root.Spawn(actors.RequestProps(s.deps)), first)
}
