package daemon

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/pull"
)

// answersSeen records the answers of StartPullHeld calls.
type answersSeen struct {
	got []string // pull ids answered, or "error <code>"
}

func (s *answersSeen) answer(rep *messages.StartPullReply, err error) {
	if err != nil {
		s.got = append(s.got, fmt.Sprint("error ", int(api.CodeOf(err))))
		return
	}
	s.got = append(s.got, rep.PullId)
}

// heldAtStart is a pullStarter that records, when each puller starts, how
// many answers were held then.
type heldAtStart struct {
	fakePullers
	answers *pullAnswers
	held    []int
}

func (h *heldAtStart) startPull(p *pull.Pull) {
	h.held = append(h.held, h.answers.pending())
	h.fakePullers.startPull(p)
}

// TestStartPullHeld: a started pull's answer is held (from before its
// puller starts) until its pull ends, or until pullAnswerHold passes; a
// refused pull and a pull.start sent again for a running pull are
// answered at once; an answer goes once.
func TestStartPullHeld(t *testing.T) {
	a, regs, _ := newTestPullAPI()
	fc := a.clock.(*clock.Fake)
	a.answers = newPullAnswers(fc, pullAnswerHold)
	starter := &heldAtStart{answers: a.answers}
	a.pullers = starter
	regs.put(t, "d1", "r", testLayout(), "test")
	ctx := context.Background()
	var seen answersSeen

	a.StartPullHeld(ctx, &messages.StartPullRequest{EngineId: "d1"}, seen.answer)
	if len(seen.got) != 1 || seen.got[0] != fmt.Sprint("error ", int(api.CodeBadRequest)) {
		t.Fatalf("a refused pull: answers %v, want its error at once", seen.got)
	}

	seen.got = nil
	a.StartPullHeld(ctx, pullOf(tid1, "p1", 2, 3), seen.answer)
	if len(seen.got) != 0 {
		t.Fatalf("a started pull answered %v before it ended", seen.got)
	}
	if len(starter.held) != 1 || starter.held[0] != 1 {
		t.Fatalf("answers held when the puller started: %v, want [1] (held before the puller can end)", starter.held)
	}
	// Sent again while it runs (its answer lost, say): answered at once,
	// the first answer still held.
	a.StartPullHeld(ctx, pullOf(tid1, "p1", 2, 3), seen.answer)
	if len(seen.got) != 1 || seen.got[0] != "p1" || a.answers.pending() != 1 {
		t.Fatalf("pull.start sent again: answers %v, %d held; want [p1] at once and the first still held", seen.got, a.answers.pending())
	}
	seen.got = nil
	a.answers.ended("p1")
	a.answers.ended("p1")
	if len(seen.got) != 1 || seen.got[0] != "p1" || a.answers.pending() != 0 {
		t.Fatalf("after the pull ended: answers %v, %d held; want [p1] once", seen.got, a.answers.pending())
	}

	// A pull that runs past the hold is answered when it runs out, once.
	seen.got = nil
	a.StartPullHeld(ctx, pullOf(tid2, "p2", 4, 5), seen.answer)
	fc.Advance(pullAnswerHold - time.Microsecond)
	if len(seen.got) != 0 {
		t.Fatalf("answered %v before the hold ran out", seen.got)
	}
	fc.Advance(time.Microsecond)
	a.answers.ended("p2")
	if len(seen.got) != 1 || seen.got[0] != "p2" {
		t.Fatalf("after the hold ran out and the pull ended: answers %v, want [p2] once", seen.got)
	}
	if fc.Pending() != 0 {
		t.Fatalf("%d timers left", fc.Pending())
	}
}

// TestPullAnswersAtOnce: without a hold (or without the table) an answer
// goes at once.
func TestPullAnswersAtOnce(t *testing.T) {
	for _, p := range []*pullAnswers{nil, newPullAnswers(clock.NewFake(time.Unix(0, 0)), 0)} {
		n := 0
		p.hold("p1", func() { n++ })
		p.ended("p1")
		if n != 1 {
			t.Fatalf("%v: sent %d times, want once at once", p, n)
		}
	}
}
