package router

import "sync"

// legShare is what a decode leg's two goroutines share: the leg's own
// (Server.leg), which waits for everything that can end the leg — its
// events, its stall timer, health probes, membership, the client, the
// router's shutdown — and its reader's (Server.readLeg), which reads the
// engine's stream.
//
// The reader relays a plain chunk itself (a choice — tokens, a finish
// reason, logprobs — and neither an error nor a Connex field): the tokens
// go to the client from the goroutine that read them. Handing every token over to the leg's goroutine cost a goroutine
// wake-up, and often a thread's, a token: a seventh of the router's CPU on
// a streamed answer (BENCHMARKS.md, "the router's relay"). Anything else
// goes to the leg's goroutine on the leg's events channel, and while
// anything sent there is not yet handled, chunks follow it there: the
// client gets every chunk in the engine's order.
//
// mu guards the leg's state (its emitter, its stall rule and timer, the
// request's token callbacks) whichever goroutine works on it; the leg's
// goroutine holds it while it handles what woke it, the reader while it
// relays. Once the leg ends (relaying false, set under mu before Server.leg
// returns) the reader never touches that state again: what it reads goes
// to the events channel, where a retired leg's watcher may drain it.
type legShare struct {
	mu sync.Mutex
	// relaying: the reader may relay plain token chunks. Set when the leg
	// starts; false once the leg ended or a relay by the reader ended the
	// answer (the reader then sends relayEnded, after releasing mu: the
	// leg's goroutine may handle another wake-up first, and ends the leg
	// as the emitter says whatever woke it).
	relaying bool
	// queued counts the events the reader sent to the leg's goroutine that
	// it has not handled yet.
	queued int
	// delivered: a token reached the emitter on this leg (a leg given up
	// before this one can no longer take the answer back).
	delivered bool
	// relay relays one plain token chunk (more: another event is ready at
	// the reader) and reports false when the answer can take no more (a
	// stop string matched, or the emitter failed): the leg must end.
	relay func(ch *engineChunk, more bool) bool
	// relays counts the chunks the reader relayed.
	relays int
}

// relayOutcome is what legShare.take did with a chunk.
type relayOutcome int

const (
	notRelayed relayOutcome = iota // the reader sends it to the leg's goroutine
	relayed                        // the reader relayed it
	relayEnded                     // relayed, and the answer ended or failed: the leg's goroutine must end the leg
)

// plainTokens reports whether the reader may relay ch itself: a choice,
// and neither an error nor a Connex field (those change how the leg ends
// or what the answer's record says: the leg's goroutine handles them).
func plainTokens(ch *engineChunk) bool {
	return ch != nil && len(ch.Choices) > 0 && len(ch.Connex) == 0 && (len(ch.Error) == 0 || isNull(ch.Error))
}

// take is the reader's: it relays ev's chunk when the leg is on, the chunk
// is plain tokens and nothing sent to the leg's goroutine waits there.
func (l *legShare) take(ev legEvent) relayOutcome {
	if ev.err != nil || ev.resp != nil || !plainTokens(ev.chunk) {
		return notRelayed
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.relaying || l.queued > 0 {
		return notRelayed
	}
	l.relays++
	if !l.relay(ev.chunk, ev.more) {
		l.relaying = false
		return relayEnded
	}
	return relayed
}

// sent counts n events the reader is about to send to the leg's goroutine.
func (l *legShare) sent(n int) {
	l.mu.Lock()
	l.queued += n
	l.mu.Unlock()
}
