package daemon

import (
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/actors"
)

// TestTell: an actor's answer reaches the callback, once, and the answer
// process is forgotten; an actor that is gone is reported dead (the
// caller then asks the directory again).
func TestTell(t *testing.T) {
	sys := actor.NewActorSystem()
	defer sys.Shutdown()
	echo := sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		if s, ok := c.Message().(string); ok {
			c.Respond(actors.Reply{Err: errors.New(s)})
		}
	}))
	type answer struct {
		rep  actors.Reply
		dead bool
	}
	got := make(chan answer, 2)
	f := func(rep actors.Reply, dead bool) { got <- answer{rep, dead} }
	next := func() answer {
		t.Helper()
		select {
		case a := <-got:
			return a
		case <-time.After(5 * time.Second):
			t.Fatal("no answer within 5s")
			return answer{}
		}
	}
	before := processCount(sys)
	if err := tell(sys, echo, "hello", f); err != nil {
		t.Fatal(err)
	}
	if a := next(); a.dead || a.rep.Err == nil || a.rep.Err.Error() != "hello" {
		t.Fatalf("answer %+v", a)
	}
	if n := processCount(sys); n != before {
		t.Fatalf("%d processes after the answer, %d before: the answer process was not forgotten", n, before)
	}

	if err := sys.Root.StopFuture(echo).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := tell(sys, echo, "anyone?", f); err != nil {
		t.Fatal(err)
	}
	if a := next(); !a.dead {
		t.Fatalf("a stopped actor's answer: %+v, want dead", a)
	}
	select {
	case a := <-got:
		t.Fatalf("a second answer: %+v", a)
	default:
	}
}

// processCount is how many local processes sys has registered.
func processCount(sys *actor.ActorSystem) int {
	n := 0
	for _, m := range sys.ProcessRegistry.LocalPIDs.LocalPIDs {
		n += m.Count()
	}
	return n
}
