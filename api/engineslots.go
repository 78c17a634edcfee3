package api

import "sync"

// engineSlots bounds the calls each engine has in flight on one member's
// service (ServeOptions.MaxInFlightPerEngine), inside the member's own
// bound: one engine's burst of slow calls answers that engine
// CodeOverloaded and leaves the member's other slots to its neighbours.
type engineSlots struct {
	max int
	mu  sync.Mutex
	n   map[string]int
}

// take counts a call of engine; false when the engine has max in flight.
func (e *engineSlots) take(engine string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n[engine] >= e.max {
		return false
	}
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[engine]++
	return true
}

// give ends a call of engine counted by take.
func (e *engineSlots) give(engine string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n[engine]--; e.n[engine] <= 0 {
		delete(e.n, engine) // the table holds only engines with calls in flight
	}
}
