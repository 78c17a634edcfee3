package advertise

// Liveness decides, from connection attempts to registered engines' HTTP
// ports, which engine processes are gone. A refused connection (nothing
// listens on the port) is the kernel's word that the process exited — a
// SIGKILL or a crash closes its sockets at once — where its registration
// would lapse only after its TTL. A paused engine (SIGSTOP) still completes
// connections and a slow or unroutable one times out: neither is a
// departure. An engine is judged only once it has been seen listening under
// its current instance, because an engine may register before it serves
// (vLLM's connector registers from the engine core before the API server
// listens). It is pure: the caller dials and passes the outcome
// (daemon/engineprobe.go). It is not safe for concurrent use.
type Liveness struct {
	seen map[string]string // engine id -> instance seen listening
}

// NewLiveness returns a Liveness that has seen no engine listen.
func NewLiveness() *Liveness { return &Liveness{seen: map[string]string{}} }

// Dial is the outcome of one connection attempt to an engine's port.
type Dial int

// Outcomes of a connection attempt.
const (
	// Connected: something listens.
	Connected Dial = iota
	// Refused: nothing listens (ECONNREFUSED).
	Refused
	// Failed: anything else (a timeout, no route): not a departure.
	Failed
)

// Verdict is what one connection attempt says about an engine.
type Verdict int

// Verdicts of Observe.
const (
	// Unchanged: nothing new is known.
	Unchanged Verdict = iota
	// Listening: this instance is seen listening for the first time; from
	// now on a refused connection means it is gone.
	Listening
	// Gone: the instance was seen listening and its port now refuses.
	Gone
)

// Observe records the outcome of a connection attempt to engine id's
// instance. A gone instance is forgotten.
func (l *Liveness) Observe(id, instance string, d Dial) Verdict {
	inst, seen := l.seen[id]
	if d == Connected {
		l.seen[id] = instance
		if seen && inst == instance {
			return Unchanged
		}
		return Listening
	}
	if !seen || inst != instance || d != Refused {
		return Unchanged
	}
	delete(l.seen, id)
	return Gone
}

// Forget drops what is known of engines not in keep (left by other means).
func (l *Liveness) Forget(keep func(id string) bool) {
	for id := range l.seen {
		if !keep(id) {
			delete(l.seen, id)
		}
	}
}
