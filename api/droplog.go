package api

import (
	"sync"
	"time"
)

// dropLog rate-limits the warning about an engine's dropped calls: at most
// one line per engine per dropLogEvery, saying how many were dropped since
// the last. Safe for concurrent use.
type dropLog struct {
	mu   sync.Mutex
	last map[string]dropCount
}

type dropCount struct {
	at time.Time // when the last line was logged
	n  int       // calls dropped since
}

// dropLogEvery is the shortest time between two lines about one engine.
const dropLogEvery = time.Minute

// maxDropEngines bounds the engines remembered; past it all are forgotten
// (each then logs one line more).
const maxDropEngines = 1024

// note counts a dropped call of engine at now, and reports whether to log
// it and how many calls the line covers.
func (d *dropLog) note(engine string, now time.Time) (int, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.last == nil || len(d.last) > maxDropEngines {
		d.last = map[string]dropCount{}
	}
	c, seen := d.last[engine]
	c.n++
	if seen && now.Sub(c.at) < dropLogEvery {
		d.last[engine] = c
		return 0, false
	}
	d.last[engine] = dropCount{at: now}
	return c.n, true
}
