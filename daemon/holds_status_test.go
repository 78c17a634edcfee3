package daemon

import (
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/actors"
	"github.com/connex/connex/lease"
)

// silentHoldActors answers no ask (busy, or stopped: a quarantined hold).
type silentHoldActors struct{ holdActors }

func (silentHoldActors) ask(*actor.PID, any) (actors.Reply, error) {
	return actors.Reply{}, errors.New("no answer")
}

// TestStatusesListHoldsThatDoNotAnswer: engine.state lists every live hold
// of the directory, from its entry when its actor does not answer, so that
// an engine rebuilding its holds from it (lost notices) never reads a hold
// that keeps its blocks as gone; a quarantined one says so.
func TestStatusesListHoldsThatDoNotAnswer(t *testing.T) {
	h := &holdAPI{actors: silentHoldActors{}}
	busy, quarantined := &actors.HoldEntry{Engine: "e1", Region: "r1", Created: time.Unix(1000, 0)}, &actors.HoldEntry{Engine: "e1", Region: "r1"}
	busy.State.Store(int32(lease.Held))
	quarantined.Quarantined.Store(true)
	got := map[string]string{}
	for _, st := range h.statuses(map[string]*actors.HoldEntry{"t1": busy, "t2": quarantined}) {
		if st.Freed {
			t.Errorf("%s listed as freed", st.TransferId)
		}
		got[st.TransferId] = st.State
	}
	if len(got) != 2 || got["t1"] != lease.Held.String() || got["t2"] != "quarantined" {
		t.Fatalf("statuses %v, want t1 %s and t2 quarantined", got, lease.Held.String())
	}
}
