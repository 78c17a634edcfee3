package actors

import (
	"sync"

	"github.com/asynkron/protoactor-go/actor"
)

// RequestTable maps request ids to the live request actors of this member.
type RequestTable struct {
	mu   sync.RWMutex
	live map[string]*actor.PID
}

// NewRequestTable returns an empty table.
func NewRequestTable() *RequestTable { return &RequestTable{live: map[string]*actor.PID{}} }

// Lookup returns the actor of a request hosted here.
func (t *RequestTable) Lookup(id string) (*actor.PID, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	p, ok := t.live[id]
	return p, ok
}

// Len is the number of requests hosted here (the member's load).
func (t *RequestTable) Len() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.live)
}

// All returns the actors of every request hosted here.
func (t *RequestTable) All() []*actor.PID {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]*actor.PID, 0, len(t.live))
	for _, p := range t.live {
		out = append(out, p)
	}
	return out
}

// claim reserves id for pid; false if another actor has it.
func (t *RequestTable) claim(id string, pid *actor.PID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.live[id]; ok {
		return false
	}
	t.live[id] = pid
	return true
}

func (t *RequestTable) drop(id string, pid *actor.PID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.live[id]; ok && p.Equal(pid) {
		delete(t.live, id)
	}
}
