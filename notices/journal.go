// Package notices numbers the notices a connexd publishes to each engine
// and keeps the recent ones, so that an engine that missed some (its NATS
// connection dropped, or NATS restarted) fetches them again from the last
// sequence number it saw. It does no I/O and reads no clock.
package notices

import (
	"sync"
	"time"
)

// Entry is one notice to one engine. Seq counts from 1 per engine and per
// Journal; Body is the caller's notice (a protobuf message in connexd).
type Entry struct {
	Seq  uint64
	At   time.Time
	Body any
}

// Journal keeps, per engine, the last Limit notices no older than MaxAge.
// Its methods are safe for concurrent use.
type Journal struct {
	// Limit bounds the entries kept per engine; MaxAge bounds their age.
	Limit  int
	MaxAge time.Duration

	mu  sync.Mutex
	per map[string]*engineLog
}

type engineLog struct {
	last    uint64  // sequence number of the newest notice (0: none yet)
	entries []Entry // oldest first, consecutive sequence numbers
}

// NewJournal returns an empty journal keeping up to limit notices of at
// most maxAge per engine.
func NewJournal(limit int, maxAge time.Duration) *Journal {
	return &Journal{Limit: max(limit, 1), MaxAge: maxAge, per: map[string]*engineLog{}}
}

// Append numbers body as engine's next notice at now and keeps it.
func (j *Journal) Append(engine string, body any, now time.Time) uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	l := j.per[engine]
	if l == nil {
		l = &engineLog{}
		j.per[engine] = l
	}
	l.last++
	l.entries = append(l.entries, Entry{Seq: l.last, At: now, Body: body})
	l.trim(j.Limit, now.Add(-j.MaxAge))
	return l.last
}

// trim drops entries over limit or older than oldest.
func (l *engineLog) trim(limit int, oldest time.Time) {
	drop := max(len(l.entries)-limit, 0)
	for drop < len(l.entries) && l.entries[drop].At.Before(oldest) {
		drop++
	}
	if drop > 0 {
		// Slide the window rather than copy what is kept: at the limit
		// every Append drops one, and copying the rest each time cost a
		// busy engine's every notice (a pull's PullDone among them) an
		// allocation and a copy of the whole journal. append moves the
		// entries to a new array once the old one's room is used up.
		clear(l.entries[:drop]) // the bodies dropped are garbage now
		l.entries = l.entries[drop:]
	}
}

// Since is what a caller that saw engine's notices up to after missed: at
// most max entries (max <= 0: all) with Seq > after, oldest first; last is
// the newest sequence number; gap reports that some notices after after
// are no longer kept (the caller must rebuild its state another way).
func (j *Journal) Since(engine string, after uint64, max int, now time.Time) (entries []Entry, last uint64, gap bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	l := j.per[engine]
	if l == nil {
		return nil, 0, false
	}
	l.trim(j.Limit, now.Add(-j.MaxAge))
	first := l.last + 1 // the oldest kept (last+1 when none are)
	if len(l.entries) > 0 {
		first = l.entries[0].Seq
	}
	if after > l.last {
		// A sequence this journal never reached: the caller saw another
		// journal (connexd restarted). Everything kept is news to it.
		after, gap = 0, first > 1
	} else if after+1 < first {
		gap = true
	}
	for _, e := range l.entries {
		if e.Seq > after {
			entries = append(entries, e)
			if max > 0 && len(entries) == max {
				break
			}
		}
	}
	return entries, l.last, gap
}

// Last is the newest sequence number of engine's notices (0: none yet).
func (j *Journal) Last(engine string) uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	if l := j.per[engine]; l != nil {
		return l.last
	}
	return 0
}

// Forget drops engine's notices and sequence (an engine that left).
func (j *Journal) Forget(engine string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.per, engine)
}
