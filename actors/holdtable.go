package actors

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/lease"
)

// HoldTable maps transfer ids to live hold actors, and remembers ended
// transfers (tombstones) for a while so late callers learn "expired" or
// "released" instead of "unknown transfer" — at most MaxTombstones of
// them, the oldest forgotten first. Safe for concurrent use.
type HoldTable struct {
	mu    sync.RWMutex
	live  map[string]*HoldEntry
	ended map[string]tombstone
	// order is the ended ids oldest first (ids Sweep or a later end
	// already dropped are skipped when reached).
	order    []string
	maxEnded int
	ttl      time.Duration
	clock    clock.Clock
}

// MaxTombstones bounds the ended transfers a HoldTable remembers: an engine
// that creates and releases holds fast must not grow connexd's memory for
// tombstone_s (600 s by default). ~100 bytes each.
const MaxTombstones = 1 << 16

// HoldEntry is a live hold.
type HoldEntry struct {
	PID     *actor.PID
	Engine  string
	Region  string
	Created time.Time // when the hold was created
	Blocks  int       // blocks it holds
	Bytes   uint64    // bytes it holds (blocks × layers × planes × block bytes)
	// State is the hold's lease.State, kept current by its actor (for
	// metrics by state without asking every actor).
	State atomic.Int32
	// Quarantined: the hold ended but its blocks stay held for good (its
	// registration could not be revoked); its entry stays, so that
	// engine.state keeps listing it and no engine takes the blocks back.
	Quarantined atomic.Bool
}

type tombstone struct {
	state lease.State
	at    time.Time
}

// NewHoldTable returns an empty directory keeping tombstones for ttl, as
// measured by clk (nil: the system clock). Give it the hold actors' clock.
func NewHoldTable(ttl time.Duration, clk clock.Clock) *HoldTable {
	return &HoldTable{live: map[string]*HoldEntry{}, ended: map[string]tombstone{}, maxEnded: MaxTombstones, ttl: ttl, clock: clock.Or(clk)}
}

func (d *HoldTable) put(id string, e *HoldEntry) {
	d.mu.Lock()
	d.live[id] = e
	d.mu.Unlock()
}

func (d *HoldTable) end(id string, st lease.State) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.live, id)
	d.ended[id] = tombstone{state: st, at: d.clock.Now()}
	d.order = append(d.order, id)
	for len(d.ended) > d.maxEnded && len(d.order) > 0 {
		delete(d.ended, d.order[0])
		d.order = d.order[1:]
	}
	d.trimOrder()
}

// trimOrder drops the ids at the front of order that no longer have a
// tombstone, and lets the slice's array go when most of it is behind.
func (d *HoldTable) trimOrder() {
	for len(d.order) > 0 {
		if _, ok := d.ended[d.order[0]]; ok {
			break
		}
		d.order = d.order[1:]
	}
	if cap(d.order) > 64 && len(d.order) < cap(d.order)/4 {
		d.order = append([]string(nil), d.order...)
	}
}

// Lookup returns the live hold, or the terminal state of an ended one
// (ended is true), or neither for an unknown transfer.
func (d *HoldTable) Lookup(id string) (e *HoldEntry, st lease.State, ended bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if e, ok := d.live[id]; ok {
		return e, 0, false
	}
	if t, ok := d.ended[id]; ok && d.clock.Now().Sub(t.at) < d.ttl {
		return nil, t.state, true
	}
	return nil, 0, false
}

// ByEngine lists the live holds of an engine.
func (d *HoldTable) ByEngine(engine string) map[string]*HoldEntry {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := map[string]*HoldEntry{}
	for id, e := range d.live {
		if e.Engine == engine {
			out[id] = e
		}
	}
	return out
}

// CountEngine is the number of live holds of an engine.
func (d *HoldTable) CountEngine(engine string) int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	n := 0
	for _, e := range d.live {
		if e.Engine == engine && !e.Quarantined.Load() {
			n++ // a quarantined hold is no engine's to count against it
		}
	}
	return n
}

// Live is the number of live holds.
func (d *HoldTable) Live() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.live)
}

// All lists every live hold.
func (d *HoldTable) All() map[string]*HoldEntry {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make(map[string]*HoldEntry, len(d.live))
	for id, e := range d.live {
		out[id] = e
	}
	return out
}

// Sweep forgets tombstones older than the ttl.
func (d *HoldTable) Sweep() {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.clock.Now()
	for id, t := range d.ended {
		if now.Sub(t.at) >= d.ttl {
			delete(d.ended, id)
		}
	}
	d.trimOrder()
}
