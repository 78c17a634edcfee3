package shim

import (
	"context"
	"strconv"
	"sync"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// lockedCursor is the engine's noticeCursor (noticecursor.go: the
// decisions) under its lock. mu also orders deliveries: live notices and
// replayed ones are handled one at a time, each once.
type lockedCursor struct {
	mu sync.Mutex
	noticeCursor
}

// onNotice handles a live notice: in sequence, it is delivered; after a
// gap (notices lost while NATS reconnected), the missed ones are fetched
// from connexd (engine.notices) and delivered first; a repeat is dropped.
func (e *Engine) onNotice(m *nats.Msg) {
	_, _, kind, ok := api.NoticeOf(m.Subject)
	if !ok {
		return
	}
	n, err := decodeNotice(kind, m.Data, m.Header.Get(api.HeaderContentType) == api.ContentJSON)
	if err != nil {
		e.log.Warn("bad notice", "subject", m.Subject, "err", err)
		return
	}
	seq, _ := strconv.ParseUint(m.Header.Get(api.HeaderNoticeSeq), 10, 64)
	journal := m.Header.Get(api.HeaderNoticeJournal)
	e.cursor.mu.Lock()
	defer e.cursor.mu.Unlock()
	switch e.cursor.Live(journal, seq) {
	case verdictRepeat:
		return
	case verdictCatchUp:
		if !e.catchUpLocked() {
			// The missed ones could not be fetched: hand this one on now
			// (what waits for it need not wait for them) but leave the
			// cursor before the gap, so the next renewal fetches the gap —
			// and this one again, a repeat delivery every delivery
			// tolerates. Recording it would drop the missed ones for good.
			e.deliver(n)
			return
		}
	}
	// Seen in the notice's own journal: if the fetch was answered by a
	// restarted connexd, the notice is still news and the new journal's
	// numbering is not advanced by it. Seq 0: a connexd that does not
	// number notices.
	if seq == 0 || e.cursor.Seen(journal, seq) {
		e.deliver(n)
	}
}

// caughtUp compares connexd's newest sequence number for the engine (from
// an engine.register reply) with the cursor and fetches what is missing:
// notices published while NATS was away are found within one renewal.
func (e *Engine) caughtUp(journal string, last uint64) {
	e.cursor.mu.Lock()
	defer e.cursor.mu.Unlock()
	if e.cursor.Behind(journal, last) || e.gapOwed {
		e.catchUpLocked() // (and the state read owed after lost notices)
	}
}

// seedCursor stands a new engine instance at connexd's newest notice (its
// first engine.register reply): the notices before were its predecessor's.
// A cursor that already follows a journal (a live notice came first) stays.
func (e *Engine) seedCursor(journal string, seq uint64) {
	e.cursor.mu.Lock()
	defer e.cursor.mu.Unlock()
	if j, _ := e.cursor.Position(); j == "" {
		e.cursor.Reset(journal, seq)
	}
}

// catchUpLocked fetches and delivers the notices after the cursor; false
// when the fetch failed (the cursor has not moved).
func (e *Engine) catchUpLocked() bool {
	journal, after := e.cursor.Position()
	c, cancel := context.WithTimeout(context.Background(), e.cfg.CallTimeout)
	defer cancel()
	rep, err := e.cli.EngineNotices(c, &messages.NoticesRequest{EngineId: e.cfg.EngineID, AfterSeq: after, Journal: journal})
	if err != nil {
		e.log.Warn("engine.notices failed; missed notices will be fetched at the next renewal", "err", err)
		return false
	}
	e.cursor.Seen(rep.Journal, 0) // a restarted connexd's journal: everything it kept is news
	if rep.Gap {
		_, after = e.cursor.Position()
		e.log.Warn("some missed notices are no longer kept by connexd; holds are read from its state, pulls waiting for them fail at their deadline", "after_seq", after, "journal", rep.Journal)
	}
	replayed := 0
	for _, n := range rep.Notices {
		if e.cursor.Seen(rep.Journal, n.Seq) {
			e.deliver(n)
			replayed++
		}
	}
	if rep.Gap || e.gapOwed {
		e.gapOwed = !e.holdsFromState()
	}
	if replayed > 0 {
		_, at := e.cursor.Position()
		e.log.Info("missed notices replayed", "notices", replayed, "seq", at)
	}
	return true
}

// holdsFromState gives back the blocks of the holds connexd no longer keeps
// (their blocks.freed notices were lost for good: connexd's journal is
// bounded), read from engine.state; false when the read failed (tried
// again at the next catch-up). Holds made after the read began are not
// judged by it.
func (e *Engine) holdsFromState() bool {
	e.mu.Lock()
	before := e.alloc.HeldIDs()
	e.mu.Unlock()
	c, cancel := context.WithTimeout(context.Background(), e.cfg.CallTimeout)
	defer cancel()
	st, err := e.cli.EngineState(c, &messages.EngineStateRequest{EngineId: e.cfg.EngineID})
	if err != nil {
		e.log.Warn("engine.state failed after lost notices; tried again at the next catch-up", "err", err)
		return false
	}
	live := map[string]bool{}
	for _, h := range st.GetHolds() {
		if !h.GetFreed() {
			live[h.GetTransferId()] = true
		}
	}
	e.mu.Lock()
	n := e.alloc.FreedUnless(live, before)
	if n > 0 {
		e.signalLocked()
	}
	e.mu.Unlock()
	if n > 0 {
		e.log.Info("holds ended while their notices were lost: blocks given back", "holds", n)
	}
	return true
}

// decodeNotice reads a live notice of kind into the journal's form.
func decodeNotice(kind string, data []byte, isJSON bool) (*messages.Notice, error) {
	n := &messages.Notice{Kind: kind}
	var err error
	switch kind {
	case api.KindPullDone:
		b := new(messages.PullDone)
		err, n.Body = unmarshal(data, isJSON, b), &messages.Notice_PullDone{PullDone: b}
	case api.KindFreed:
		b := new(messages.BlocksFreed)
		err, n.Body = unmarshal(data, isJSON, b), &messages.Notice_BlocksFreed{BlocksFreed: b}
	case api.KindFenced:
		b := new(messages.FencedNotice)
		err, n.Body = unmarshal(data, isJSON, b), &messages.Notice_Fenced{Fenced: b}
	case api.KindResume:
		b := new(messages.ResumeNotice)
		err, n.Body = unmarshal(data, isJSON, b), &messages.Notice_Resume{Resume: b}
	case api.KindHoldLost:
		b := new(messages.HoldLostNotice)
		err, n.Body = unmarshal(data, isJSON, b), &messages.Notice_HoldLost{HoldLost: b}
	}
	return n, err
}

// unmarshal is api.Unmarshal with a plain error.
func unmarshal(data []byte, isJSON bool, m proto.Message) error {
	if err := api.Unmarshal(data, isJSON, len(data), m); err != nil {
		return err
	}
	return nil
}

// deliver hands a notice to the part of the engine that waits for it.
func (e *Engine) deliver(n *messages.Notice) {
	switch b := n.Body.(type) {
	case *messages.Notice_PullDone:
		e.onPullDone(b.PullDone)
	case *messages.Notice_BlocksFreed:
		e.onFreed(b.BlocksFreed)
	case *messages.Notice_Fenced:
		e.onFenced(b.Fenced)
	case *messages.Notice_HoldLost:
		h := b.HoldLost
		e.log.Warn("a request's hold is gone: a resume of it cannot pull its KV",
			"request", h.RequestId, "transfer", h.TransferId, "reason", h.Reason, "policy", h.KvLoadFailurePolicy)
	case *messages.Notice_Resume:
		// Resumes are the router's here (requests run with resume
		// authority "router"); a cluster-adopted request is not ours.
		e.log.Info("resume notice ignored: this engine's requests are resumed by the router", "request", b.Resume.GetState().GetRequestId())
	}
}
