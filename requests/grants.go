package requests

import (
	"sync"
	"time"
)

// GrantTTL is how long the router's word for a takeover stands when the
// router names no lifetime (StartRequestMsg.grant_ttl_ms): from the router
// picking the engine to the engine's request.start{takeover}, which comes
// once the engine schedules the resumed leg (well under a second on an
// engine with room; as long as its queue on a full one). 30 s is the
// router's default wait for that leg's first token.
const GrantTTL = 30 * time.Second

// MaxGrantTTL bounds the lifetime a router may ask for (its own first-token
// wait is at most an hour).
const MaxGrantTTL = time.Hour

// GrantLifetime is the lifetime of a grant whose router asked for ms
// milliseconds (StartRequestMsg.grant_ttl_ms): GrantTTL for 0, at most
// MaxGrantTTL.
func GrantLifetime(ms uint32) time.Duration {
	if ms == 0 {
		return GrantTTL
	}
	return min(time.Duration(ms)*time.Millisecond, MaxGrantTTL)
}

// MaxGrants bounds the grants one member keeps; the oldest goes first.
const MaxGrants = 4096

// Grants are the takeovers an authority (the router that streams a request,
// over the member-only peer.grant) allowed on this member: request id →
// the engine it picked. A takeover by an engine needs one (Take), so a
// request id alone moves nothing. Safe for concurrent use; time comes from
// the caller.
type Grants struct {
	mu   sync.Mutex
	live map[string]grant
}

type grant struct {
	engine  string
	expires time.Time
}

// Grant records that engine may take request over until now+ttl
// (GrantLifetime).
func (g *Grants) Grant(request, engine string, ttl time.Duration, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.live == nil {
		g.live = map[string]grant{}
	}
	for id, gr := range g.live {
		if !now.Before(gr.expires) {
			delete(g.live, id)
		}
	}
	if len(g.live) >= MaxGrants {
		oldest := ""
		for id, gr := range g.live {
			if oldest == "" || gr.expires.Before(g.live[oldest].expires) {
				oldest = id
			}
		}
		delete(g.live, oldest)
	}
	g.live[request] = grant{engine: engine, expires: now.Add(ttl)}
}

// Take consumes the grant of request to engine; false if there is none
// for that engine, or it expired.
func (g *Grants) Take(request, engine string, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	gr, ok := g.live[request]
	if !ok || gr.engine != engine || !now.Before(gr.expires) {
		return false
	}
	delete(g.live, request)
	return true
}
