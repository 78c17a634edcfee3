package daemon

import (
	"sync"
	"time"

	"github.com/connex/connex/messages"
)

// Bounds of what pullTable remembers of pulls that ended: long enough to
// cover an engine's pull.start resends (the Go shim and the vLLM connector
// send it up to three times, a call timeout apart), small enough to cost
// little (an id, an engine, a transfer and a time per entry).
const (
	endedPullTTL = time.Minute
	endedPullMax = 8192
)

// pullTable is the pulls this member runs, by pull id (engine.state), and
// the ones that ended within endedPullTTL: a pull.start sent again after
// its pull ended (the first answer was lost with a NATS server) must not
// start the pull a second time — the engine would take the first pull's
// pull.done for it and reuse its blocks while the second still writes them.
type pullTable struct {
	mu    sync.Mutex
	pulls map[string]pullEntry
	ended map[string]endedPull
	order []endedAt // ended, oldest first
}

type pullEntry struct {
	engine string
	info   *messages.PullInFlight
}

type endedPull struct {
	engine, transfer string
	at               time.Time
}

type endedAt struct {
	id string
	at time.Time
}

func newPullTable() *pullTable {
	return &pullTable{pulls: map[string]pullEntry{}, ended: map[string]endedPull{}}
}

// claim records a pull about to start, unless one with its id runs or
// ended lately: then it reports whether that one is the same pull (same
// engine and transfer: a pull.start sent again because its answer was
// lost) and records nothing.
func (t *pullTable) claim(engine, pullID, transfer string, now time.Time) (claimed, same bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
	if p, ok := t.pulls[pullID]; ok {
		return false, p.engine == engine && p.info.TransferId == transfer
	}
	if e, ok := t.ended[pullID]; ok && e.engine == engine && e.transfer == transfer {
		return false, true // it ran and ended: its pull.done is out (and in the journal)
	}
	t.pulls[pullID] = pullEntry{engine: engine, info: &messages.PullInFlight{PullId: pullID, TransferId: transfer, StartedUnixMs: now.UnixMilli(), EngineId: engine}}
	return true, false
}

// forget drops a claimed pull that never started (refused before it ran):
// the same id may be sent again and start then.
func (t *pullTable) forget(pullID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.pulls, pullID)
}

// done records that a pull ended (its pull.done is published).
func (t *pullTable) done(pullID string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.pulls[pullID]
	if !ok {
		return
	}
	delete(t.pulls, pullID)
	t.expireLocked(now)
	t.ended[pullID] = endedPull{engine: p.engine, transfer: p.info.TransferId, at: now}
	t.order = append(t.order, endedAt{pullID, now})
	for len(t.order) > endedPullMax {
		t.dropOldestLocked()
	}
}

func (t *pullTable) expireLocked(now time.Time) {
	for len(t.order) > 0 && now.Sub(t.order[0].at) > endedPullTTL {
		t.dropOldestLocked()
	}
}

func (t *pullTable) dropOldestLocked() {
	o := t.order[0]
	t.order = t.order[1:]
	if e, ok := t.ended[o.id]; ok && e.at.Equal(o.at) {
		delete(t.ended, o.id)
	}
}

// of lists the pulls of engine ("": every engine's) that run.
func (t *pullTable) of(engine string) []*messages.PullInFlight {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*messages.PullInFlight
	for _, p := range t.pulls {
		if engine == "" || p.engine == engine {
			out = append(out, p.info)
		}
	}
	return out
}

// Len is the number of pulls running.
func (t *pullTable) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pulls)
}
