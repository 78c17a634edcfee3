package daemon

import (
	"sync"
	"time"

	"github.com/connex/connex/clock"
)

// pullAnswerHold is how long a started pull's pull.start answer waits for
// the pull to end. A pull that ends within it (a small pull reads in well
// under a millisecond) is answered right before its pull.done is published,
// on the same connection, so that the two leave connexd in one write and
// the engine wakes once for both, as the engine API's floor does; a longer
// one is answered when the hold runs out. Engines must take pull.done
// whether or not pull.start's answer has arrived (the vLLM connector
// records a pull before it sends pull.start).
const pullAnswerHold = 5 * time.Millisecond

// pullAnswers holds the pull.start answers of started pulls until their
// pull ends or pullAnswerHold passes, whichever comes first. Safe for
// concurrent use; an answer is sent under its lock, so a pull's answer
// always goes out before its pull.done (ended is called before the
// publish).
type pullAnswers struct {
	wait  time.Duration // 0: answers go at once
	clock clock.Clock

	mu   sync.Mutex
	held map[string]*heldAnswer // by pull id
}

type heldAnswer struct {
	send  func()
	timer clock.Timer
}

func newPullAnswers(c clock.Clock, wait time.Duration) *pullAnswers {
	return &pullAnswers{wait: wait, clock: clock.Or(c), held: map[string]*heldAnswer{}}
}

// hold keeps send, pull id's answer, until ended(id) or the hold runs out.
// A nil receiver or a zero hold sends at once. A second hold for the same
// id (never: pull ids are claimed once) sends the first one's answer.
func (p *pullAnswers) hold(id string, send func()) {
	if p == nil || p.wait <= 0 {
		send()
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if old := p.held[id]; old != nil {
		old.timer.Stop()
		old.send()
	}
	h := &heldAnswer{send: send}
	h.timer = p.clock.AfterFunc(p.wait, func() { p.release(id, h) })
	p.held[id] = h
}

// ended sends pull id's held answer, if it is still held: called right
// before its pull.done is published.
func (p *pullAnswers) ended(id string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if h := p.held[id]; h != nil {
		delete(p.held, id)
		h.timer.Stop()
		h.send()
	}
}

// release sends h when its hold runs out, unless it went already.
func (p *pullAnswers) release(id string, h *heldAnswer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[id] == h {
		delete(p.held, id)
		h.send()
	}
}

// pending is how many answers are held (for tests and status).
func (p *pullAnswers) pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}
