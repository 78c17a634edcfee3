package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
)

// TestGrantMovesRequestAhead: a router's grant to an engine registered
// here spawns the request's actor with the grant (the move ahead of the
// takeover), and the engine's takeover then goes to that actor; a grant to
// an engine with no region here moves nothing.
func TestGrantMovesRequestAhead(t *testing.T) {
	a, acts, _ := newTestRequestAPI()
	a.tryBackground = func(f func()) bool { f(); return true }
	a.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	if _, err := a.GrantTakeover(ctx, &messages.StartRequestMsg{RequestId: "r1", EngineId: "d1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.GrantTakeover(ctx, &messages.StartRequestMsg{RequestId: "r2", EngineId: "d9"}); err != nil {
		t.Fatal(err)
	}
	got := acts.messages()
	if len(got) != 1 || got[0].to != "r1" {
		t.Fatalf("actors got %v, want one grant of r1", got)
	}
	if g, ok := got[0].msg.(*actors.GrantRequest); !ok || g.Engine != "d1" || g.Instance != "i1" {
		t.Fatalf("r1's actor got %#v, want a grant to d1 (instance i1)", got[0].msg)
	}
	if _, err := a.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "r1", EngineId: "d1", Takeover: true, Params: heldBy("p1"), PromptTokenIds: []uint32{1, 2, 3}}); err != nil {
		t.Fatal(err)
	}
	if err := lastTakeover(acts, "r1", "d1"); err != nil {
		t.Fatal(err)
	}
}

// TestTakeoverRacingTheGrantsMove: an engine's takeover whose own actor
// loses the id to the grant's (spawned a moment before) is sent to the
// grant's actor, not refused.
func TestTakeoverRacingTheGrantsMove(t *testing.T) {
	a, acts, _ := newTestRequestAPI()
	acts.spawnErr = fmt.Errorf("claim: %w", requests.ErrExists)
	if _, err := a.StartRequest(context.Background(), &messages.StartRequestMsg{RequestId: "r1", EngineId: "d1", Takeover: true, Params: heldBy("p1"), PromptTokenIds: []uint32{1, 2, 3}}); err != nil {
		t.Fatalf("a takeover that lost the claim to the grant's actor: %v", err)
	}
	if err := lastTakeover(acts, "r1", "d1"); err != nil {
		t.Fatal(err)
	}
}

// lastTakeover checks that the last message an actor got is engine's
// takeover of request id.
func lastTakeover(acts *fakeRequestActors, id, engine string) error {
	got := acts.messages()
	if len(got) == 0 {
		return fmt.Errorf("no actor got anything")
	}
	last := got[len(got)-1]
	if tk, ok := last.msg.(*actors.TakeoverRequest); !ok || last.to != id || tk.Msg.EngineId != engine {
		return fmt.Errorf("the last message went to %s: %#v, want %s's takeover of %s", last.to, last.msg, engine, id)
	}
	return nil
}
