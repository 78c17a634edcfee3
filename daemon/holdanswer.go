package daemon

import (
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
)

// answerProcess is the sender of a request to a hold actor whose answer
// nobody waits for: protoactor delivers the actor's ctx.Respond to it, and
// it hands the answer to a callback on the actor's goroutine. It is a
// future without the waiting goroutine, for peer.descriptors, whose answer
// goes straight back to the reader from there (api's deferred endpoints).
type answerProcess struct {
	sys  *actor.ActorSystem
	pid  *actor.PID
	done atomic.Bool
	f    func(actors.Reply, bool) // the answer, or dead=true when the actor was gone
	// timer forgets the process after askTimeout if no answer came (an
	// actor that stopped with the request in its mailbox), as a future's
	// timeout does.
	timer *time.Timer
}

var _ actor.Process = (*answerProcess)(nil)

// tell sends msg to the actor pid with an answerProcess as its sender.
func tell(sys *actor.ActorSystem, pid *actor.PID, msg any, f func(rep actors.Reply, dead bool)) error {
	p := &answerProcess{sys: sys, f: f}
	self, ok := sys.ProcessRegistry.Add(p, "answer"+sys.ProcessRegistry.NextId())
	if !ok {
		return api.Errorf(api.CodeInternal, "no process id for the answer of %s", pid.Id)
	}
	p.pid = self
	p.timer = time.AfterFunc(askTimeout, func() { p.forget(false) })
	sys.Root.RequestWithCustomSender(pid, msg, self)
	return nil
}

// SendUserMessage takes the hold's answer (or the dead letter that stands
// for it) and forgets the process.
func (p *answerProcess) SendUserMessage(_ *actor.PID, message any) {
	if !p.forget(true) {
		return
	}
	_, msg, _ := actor.UnwrapEnvelope(message)
	switch m := msg.(type) {
	case actors.Reply:
		p.f(m, false)
	case *actor.DeadLetterResponse:
		p.f(actors.Reply{}, true)
	default:
		p.f(actors.Reply{Err: api.Errorf(api.CodeInternal, "unexpected reply %T", msg)}, false)
	}
}

// SendSystemMessage ignores system messages: the process has no actor.
func (p *answerProcess) SendSystemMessage(*actor.PID, any) {}

// Stop forgets the process.
func (p *answerProcess) Stop(*actor.PID) { p.forget(true) }

// forget removes the process from the registry, once; it reports whether
// this call did. stopTimer is false on the timer's own goroutine.
func (p *answerProcess) forget(stopTimer bool) bool {
	if !p.done.CompareAndSwap(false, true) {
		return false
	}
	if stopTimer {
		p.timer.Stop()
	}
	p.sys.ProcessRegistry.Remove(p.pid)
	return true
}
