package handover

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// TokenTTL is how long a token stays valid after region.create issued it:
// an engine maps its region right after the reply, so a minute covers a slow
// start while leaving a leaked token little time.
const TokenTTL = 60 * time.Second

// MaxGrants bounds the tokens outstanding at once; past it the oldest token
// of the engine holding the most is forgotten (its engine creates the region
// again for a new one). An engine calling region.create in a loop cannot grow
// connexd's memory.
const MaxGrants = 1024

// MaxGrantsPerEngine bounds one engine's outstanding tokens; past it that
// engine's own oldest is forgotten. An engine calling region.create in a loop
// therefore only ever forgets its own tokens, never a neighbour's: an engine
// maps its region right after the reply, so it needs one or two at a time.
const MaxGrantsPerEngine = 64

// ErrRefused means the socket refused a handover: unknown, used or expired
// token, a token for another engine's region, or a malformed request. The
// message says which, without naming anything the caller did not send.
var ErrRefused = errors.New("handover: refused")

// ErrBusy means the socket served as many handovers as it takes at once
// (a local user may be filling them); the token is still valid: try again.
var ErrBusy = errors.New("handover: region socket busy")

// grant is one outstanding token.
type grant struct {
	engine, region string
	token          []byte // hex, as the caller presents it
	ref            any    // what the Opener gets back: the region as granted
	expires        time.Time
}

// grants is the table of outstanding tokens. It is pure: the caller passes
// the time and holds the lock.
type grants struct {
	max       int     // every engine's tokens together
	perEngine int     // one engine's tokens (0: MaxGrantsPerEngine)
	list      []grant // oldest first
}

// issue records a new token for engine's region, valid until now+ttl, and
// returns it. Expired tokens go first; past the engine's bound its own
// oldest goes, and past max the oldest of the engine holding the most.
func (g *grants) issue(engine, region string, ref any, now time.Time, ttl time.Duration) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("handover: token for engine %s region %s: %w", engine, region, err)
	}
	tok := hex.EncodeToString(b[:])
	g.expire(now)
	per := g.perEngine
	if per <= 0 {
		per = MaxGrantsPerEngine
	}
	for g.count(engine) >= per {
		g.dropOldest(engine)
	}
	for len(g.list) >= g.max && len(g.list) > 0 {
		g.dropOldest(g.largest())
	}
	g.list = append(g.list, grant{engine: engine, region: region, token: []byte(tok), ref: ref, expires: now.Add(ttl)})
	return tok, nil
}

// take consumes the token for engine's region and returns the grant's ref.
// Every token of the table is compared in constant time, so neither the
// time taken nor the answer tells a caller how close a guess came; a token
// of another engine's region is refused (and stays valid for its engine).
func (g *grants) take(engine, region, token string, now time.Time) (any, error) {
	g.expire(now)
	found := -1
	for i := range g.list {
		match := subtle.ConstantTimeCompare(g.list[i].token, []byte(token)) == 1
		if match && g.list[i].engine == engine && g.list[i].region == region {
			found = i
		}
	}
	if found < 0 {
		return nil, fmt.Errorf("%w: no valid token for engine %s region %s (tokens work once, for %s, for the engine whose region.create returned them: create the region again for a new one)",
			ErrRefused, engine, region, TokenTTL)
	}
	ref := g.list[found].ref
	g.list = append(g.list[:found], g.list[found+1:]...)
	return ref, nil
}

// count is how many tokens engine holds.
func (g *grants) count(engine string) int {
	n := 0
	for i := range g.list {
		if g.list[i].engine == engine {
			n++
		}
	}
	return n
}

// largest names the engine holding the most tokens (among equals, the first
// to reach that count in age order, so the choice is deterministic).
func (g *grants) largest() string {
	counts := map[string]int{}
	best, most := "", 0
	for i := range g.list {
		e := g.list[i].engine
		counts[e]++
		if counts[e] > most {
			best, most = e, counts[e]
		}
	}
	return best
}

// dropOldest forgets engine's oldest token.
func (g *grants) dropOldest(engine string) {
	for i := range g.list {
		if g.list[i].engine == engine {
			last := len(g.list) - 1
			copy(g.list[i:], g.list[i+1:])
			g.list[last] = grant{} // the ref goes with it
			g.list = g.list[:last]
			return
		}
	}
}

// forget drops every token of engine's regions (the engine went away).
func (g *grants) forget(engine string) {
	kept := g.list[:0]
	for _, gr := range g.list {
		if gr.engine != engine {
			kept = append(kept, gr)
		}
	}
	clear(g.list[len(kept):])
	g.list = kept
}

// expire drops the tokens past their time.
func (g *grants) expire(now time.Time) {
	i := 0
	for i < len(g.list) && !now.Before(g.list[i].expires) {
		i++
	}
	if i > 0 {
		clear(g.list[:i])
		g.list = g.list[i:]
	}
}
