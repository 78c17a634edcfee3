package pull

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// pullMachine decides a pull's control plane: when to ask the holder for
// its descriptors again, when to give up on them, when to start the reads,
// when to renew the lease, whether to wait for the holder's PullEnd answer
// and what the pull ends with. It is pure: time comes in with every event
// (injected clock), effects go out, and the puller's goroutine (puller.go)
// performs them and turns their results, its clock timer (set for Wake),
// and the pull's context ending (shutdown, the whole-pull timeout, the
// holder leaving the cluster) back into events. The data-plane reads
// themselves (batches, the stall watch on progress) are one effect, read,
// whose result is the event readDone. Scripts: testdata/pull/*.txt.
//
//	asking ──answer(descriptors)──▶ reading ──readDone(ok, PullEnd awaited)──▶ ending ──endAck──▶ done
//	  │                               │ renew every retain/3                                       ▲
//	  │ re-ask every stall/3,          └──readDone(failed, or PullEnd async)──────────────────────┤
//	  │ 25 ms after no responders                                                                  │
//	  └──answer(error) / stall deadline / pull ended (canceled, holder left)───────────────────────┘
type pullMachine struct {
	id, member string
	stall      time.Duration
	alongside  time.Duration // re-ask beside an unanswered ask
	renewEvery time.Duration
	phase      pullPhase
	// askAt, descDeadline and renewAt are the armed deadlines (zero: not
	// armed); Wake is the earliest of them.
	askAt, descDeadline, renewAt time.Time
	lastErr                      error // the last "no responders" answer
	endAsync                     bool  // the descriptors say PullEnd need not be awaited
	// reserved: the asks so far are a reservation's (pullConfig.AskedAt).
	reserved bool
}

// pullPhase is where a pull is.
type pullPhase int

const (
	pullAsking  pullPhase = iota // descriptors asked, not answered
	pullReading                  // descriptors in hand, reads running
	pullEnding                   // reads done, the holder's PullEnd answer awaited
	pullDone                     // PullDone decided; nothing more happens
)

func (p pullPhase) String() string {
	return [...]string{"asking", "reading", "ending", "done"}[p]
}

// pullEffect is what the puller must do: one of the pullDo* kinds.
type pullEffect struct {
	kind pullDo
	desc *messages.Descriptors // read: the holder's descriptors
	ok   bool                  // endLater/endNow: PullEnd says the reads succeeded
	err  error                 // done: the pull's error, nil on success
}

// pullDo is an effect's kind.
type pullDo int

const (
	doAsk      pullDo = iota // post one more descriptors request
	doRead                   // read desc (plan, connect, batches), then report readDone
	doRenew                  // renew the hold, then report renewed
	doEndAwait               // send PullEnd{ok} and report its answer (endAck)
	doDone                   // publish PullDone with err
	doEndLater               // send PullEnd{ok} in the background, nobody waits (after done)
	doEndNow                 // send PullEnd in the background, nobody waits (before done)
	doAskOwn                 // end the reservation's read (PullEnd, nobody waits) and ask under the pull's own id
)

func (d pullDo) String() string {
	return [...]string{"ask", "read", "renew", "end-await", "done", "end-later", "end-now", "ask-own"}[d]
}

// pullConfig is what a pull's machine needs to know.
type pullConfig struct {
	ID, Member string
	Stall      time.Duration // the descriptors must come within this
	Retain     time.Duration // the hold's lease: renewed every third of it
	// AskErr is why the first descriptors request could not be sent
	// (StartPuller); the pull fails at once.
	AskErr error
	// Reserved: the pull took a reservation (reserve.go), whose
	// descriptors request went out at AskedAt, at its request.start. The
	// re-ask beside an unanswered ask counts from then; the stall deadline
	// for the answer counts from the pull's start, the pull's own budget.
	Reserved bool
	AskedAt  time.Time
}

// newPullMachine starts a pull whose first descriptors request went out at
// now, or at cfg.AskedAt (a reservation's: cfg.Reserved), or failed
// (cfg.AskErr).
func newPullMachine(now time.Time, cfg pullConfig) (*pullMachine, []pullEffect) {
	m := &pullMachine{
		id: cfg.ID, member: cfg.Member, stall: cfg.Stall,
		alongside:  max(cfg.Stall/3, 50*time.Millisecond),
		renewEvery: max(cfg.Retain/3, 100*time.Millisecond),
	}
	if cfg.AskErr != nil {
		return m, m.failAsking(nil, cfg.AskErr)
	}
	asked := now
	if m.reserved = cfg.Reserved; m.reserved && cfg.AskedAt.Before(now) {
		asked = cfg.AskedAt
	}
	m.askAt, m.descDeadline = asked.Add(m.alongside), now.Add(cfg.Stall)
	if m.askAt.Before(now) {
		m.askAt = now // a re-ask already due goes out at the first tick
	}
	return m, nil
}

// pullTick: the clock reached Now (the puller's timer, set for Wake).
type pullTick struct{ Now time.Time }

// pullAnswer: an answer to a descriptors request came: Desc, or Err (the
// holder's error; NoResponders when nobody listened on its subject: its
// member may be between NATS servers).
type pullAnswer struct {
	Now          time.Time
	Desc         *messages.Descriptors
	Err          error
	NoResponders bool
}

// pullReadDone: the reads ended, with Err nil when every byte landed.
type pullReadDone struct {
	Now time.Time
	Err error
}

// pullRenewed: a renewal (doRenew) came back, however it went.
type pullRenewed struct{ Now time.Time }

// pullEndAck: the holder answered the awaited PullEnd (Err: its error).
type pullEndAck struct {
	Now time.Time
	Err error
}

// pullEnded: the pull's context ended: Err is its error (Canceled:
// connexd shutting down; DeadlineExceeded: the whole pull's timeout),
// Gone the *HolderLeftError when its holder left the cluster. Reads end by
// themselves then (they run under that context).
type pullEnded struct {
	Now  time.Time
	Err  error
	Gone error
}

// Step applies one event and returns the effects to perform, in order.
// Events that do not apply to the phase (a late answer, a renewal after the
// reads) change nothing.
func (m *pullMachine) Step(ev any) []pullEffect {
	switch ev := ev.(type) {
	case pullTick:
		return m.tick(ev.Now)
	case pullAnswer:
		if m.phase != pullAsking {
			return nil
		}
		switch {
		case ev.NoResponders:
			m.lastErr = ev.Err
			m.askAt = ev.Now.Add(25 * time.Millisecond) // comes back at once: pace the next ask
			return nil
		case ev.Err != nil && m.reserved:
			// The reservation was refused (sent at request.start, it may
			// have found the hold not yet bound where the request store
			// lags): the pull asks for itself once, as it would have
			// without one, and the holder's answer to that decides.
			m.reserved = false
			m.askAt = ev.Now.Add(m.alongside)
			return []pullEffect{{kind: doAskOwn}}
		case ev.Err != nil:
			return m.failAsking(nil, ev.Err)
		}
		m.phase, m.askAt, m.descDeadline = pullReading, time.Time{}, time.Time{}
		m.endAsync = ev.Desc.GetPullEndAsync()
		m.renewAt = ev.Now.Add(m.renewEvery)
		return []pullEffect{{kind: doRead, desc: ev.Desc}}
	case pullRenewed:
		if m.phase == pullReading {
			m.renewAt = ev.Now.Add(m.renewEvery)
		}
		return nil
	case pullReadDone:
		if m.phase != pullReading {
			return nil
		}
		m.renewAt = time.Time{}
		if ev.Err == nil && !m.endAsync {
			m.phase = pullEnding
			return []pullEffect{{kind: doEndAwait, ok: true}}
		}
		m.phase = pullDone
		return []pullEffect{{kind: doDone, err: ev.Err}, {kind: doEndLater, ok: ev.Err == nil}}
	case pullEndAck:
		if m.phase != pullEnding {
			return nil
		}
		m.phase = pullDone
		if api.CodeOf(ev.Err) == api.CodeRegionBroken {
			// The holder's region broke during the read: what it sent
			// may be zeros.
			return []pullEffect{{kind: doDone, err: fmt.Errorf("pull %s: %w", m.id, ev.Err)}}
		}
		return []pullEffect{{kind: doDone}}
	case pullEnded:
		if m.phase != pullAsking {
			return nil // reads end with the context; PullEnd runs on its own deadline
		}
		if errors.Is(ev.Err, context.DeadlineExceeded) && ev.Gone == nil {
			return m.descriptorsTimedOut(ev.Err)
		}
		// Canceled (connexd stopping, the holder left): the cause says
		// why; never a timeout.
		return m.failAsking(ev.Gone, fmt.Errorf("peer.descriptors: %w", ev.Err))
	}
	return nil
}

func (m *pullMachine) tick(now time.Time) []pullEffect {
	switch m.phase {
	case pullAsking:
		if !now.Before(m.descDeadline) {
			return m.descriptorsTimedOut(context.DeadlineExceeded)
		}
		if !now.Before(m.askAt) {
			m.askAt = now.Add(m.alongside)
			return []pullEffect{{kind: doAsk}}
		}
	case pullReading:
		if !m.renewAt.IsZero() && !now.Before(m.renewAt) {
			m.renewAt = time.Time{} // re-armed when the renewal is back
			return []pullEffect{{kind: doRenew}}
		}
	}
	return nil
}

// descriptorsTimedOut fails a pull whose descriptors did not come in time:
// with the last "no responders" if there was one, else a timeout.
func (m *pullMachine) descriptorsTimedOut(err error) []pullEffect {
	last := m.lastErr
	if last == nil {
		last = api.Errorf(api.CodeTimeout, "peer.descriptors: %v", err)
	}
	return m.failAsking(nil, last)
}

// failAsking ends a pull whose descriptors did not come. The holder may
// have started the pull before its reply failed (a reply too large to
// send, a timeout on the way back): end it, best effort, so a release need
// not wait for the pull's deadline.
func (m *pullMachine) failAsking(gone, err error) []pullEffect {
	m.phase, m.askAt, m.descDeadline = pullDone, time.Time{}, time.Time{}
	return []pullEffect{{kind: doEndNow}, {kind: doDone, err: descriptorsErr(m.id, m.member, gone, err)}}
}

// descriptorsErr wraps a failed descriptors request of pull from member;
// gone is the holder's departure if that ended it (stepErr).
func descriptorsErr(pull, member string, gone, err error) error {
	return fmt.Errorf("pull %s: descriptors from %s: %w", pull, member, stepErr(gone, err))
}

// Wake is when the machine next needs a tick (zero: it waits for events).
func (m *pullMachine) Wake() time.Time {
	var w time.Time
	for _, t := range []time.Time{m.askAt, m.descDeadline, m.renewAt} {
		if !t.IsZero() && (w.IsZero() || t.Before(w)) {
			w = t
		}
	}
	return w
}

// Phase is where the pull is.
func (m *pullMachine) Phase() pullPhase { return m.phase }
