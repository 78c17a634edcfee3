package requests

import (
	"errors"
	"fmt"
	"sync"
)

// ErrQuota means an engine (or this member) reached its share of the
// request store: its own new requests and tokens are refused, other
// engines' are not.
var ErrQuota = errors.New("requests: quota reached")

// TokenBytes is what one token is counted for in the request store's
// quotas: a token id is a varint of at most 5 bytes, and real vocabularies
// (under 2^21) take 3 or fewer, so 4 over-counts a little.
const TokenBytes = 4

// MaxGenerated bounds the tokens request.progress may append to one
// request whose request.start gave no max_tokens (and any max_tokens): no
// model served today generates more in one request.
const MaxGenerated = 1 << 17

// Quota bounds what each engine, and this member as a whole, keeps in the
// cluster's request store: live requests and their stored tokens (counted
// as TokenBytes each). The request store is one bucket for the cluster;
// without a quota one engine's credentials fill it and every other
// member's request.start fails. It counts the requests this member's API
// started or grew; a request that ended is forgotten when its engine next
// reaches a limit (live says which still run), so no end hook is needed.
// A nil *Quota bounds nothing.
type Quota struct {
	// MaxRequests bounds one engine's live requests on this member.
	MaxRequests int
	// MaxBytes bounds one engine's stored tokens, in bytes.
	MaxBytes int64
	// MaxMemberBytes bounds all engines' stored tokens on this member.
	MaxMemberBytes int64

	mu       sync.Mutex
	byID     map[string]quotaEntry
	byEngine map[string]*Usage
	total    int64
	refused  map[string]uint64 // by what: "requests", "bytes", "member_bytes"
}

type quotaEntry struct {
	engine string
	bytes  int64
}

// Usage is what one engine holds against its quota.
type Usage struct {
	Requests int
	Bytes    int64
}

// Start admits request id of engine with tokens prompt tokens, or refuses
// it with ErrQuota. A request id already counted (a takeover, a repeated
// start) moves to engine with its bytes. live reports whether a counted
// request still runs; it is asked only when a limit is reached.
func (q *Quota) Start(id, engine string, tokens int, live func(id string) bool) error {
	if q == nil {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.init()
	bytes := int64(tokens) * TokenBytes
	prev, had := q.byID[id]
	u := q.usage(engine)
	if !had || prev.engine != engine {
		if u.Requests >= q.MaxRequests {
			q.prune(engine, live)
		}
		if u.Requests >= q.MaxRequests {
			return q.refuse("requests", "engine %s runs %d requests on this member (requests_max_per_engine=%d)", engine, u.Requests, q.MaxRequests)
		}
	}
	grow := bytes
	if had && prev.engine == engine {
		grow = bytes - prev.bytes
	}
	if err := q.room(engine, u, grow, live); err != nil {
		return err
	}
	if had {
		q.drop(id, prev)
	}
	q.byID[id] = quotaEntry{engine: engine, bytes: bytes}
	u.Requests++
	u.Bytes += bytes
	q.total += bytes
	return nil
}

// Grow admits tokens more tokens for request id (request.progress), or
// refuses them with ErrQuota. A request this quota does not count (adopted,
// started before it) is admitted.
func (q *Quota) Grow(id string, tokens int, live func(id string) bool) error {
	if q == nil {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.init()
	e, ok := q.byID[id]
	if !ok {
		return nil
	}
	bytes := int64(tokens) * TokenBytes
	u := q.usage(e.engine)
	if err := q.room(e.engine, u, bytes, live); err != nil {
		return err
	}
	e.bytes += bytes
	q.byID[id] = e
	u.Bytes += bytes
	q.total += bytes
	return nil
}

// End forgets request id (it finished, or its start failed).
func (q *Quota) End(id string) {
	if q == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if e, ok := q.byID[id]; ok {
		q.drop(id, e)
	}
}

// Engine is what engine holds now.
func (q *Quota) Engine(engine string) Usage {
	q.mu.Lock()
	defer q.mu.Unlock()
	if u := q.byEngine[engine]; u != nil {
		return *u
	}
	return Usage{}
}

// Refused is how many starts and progress calls each limit refused, by
// limit: "requests", "bytes" (an engine's), "member_bytes".
func (q *Quota) Refused() map[string]uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := map[string]uint64{"requests": 0, "bytes": 0, "member_bytes": 0}
	for k, v := range q.refused {
		out[k] = v
	}
	return out
}

func (q *Quota) init() {
	if q.byID == nil {
		q.byID, q.byEngine, q.refused = map[string]quotaEntry{}, map[string]*Usage{}, map[string]uint64{}
	}
}

func (q *Quota) usage(engine string) *Usage {
	u := q.byEngine[engine]
	if u == nil {
		u = &Usage{}
		q.byEngine[engine] = u
	}
	return u
}

// room checks that grow more bytes fit engine's and the member's limits,
// forgetting ended requests first when they would not.
func (q *Quota) room(engine string, u *Usage, grow int64, live func(string) bool) error {
	if grow <= 0 {
		return nil
	}
	if u.Bytes+grow > q.MaxBytes {
		q.prune(engine, live)
	}
	if u.Bytes+grow > q.MaxBytes {
		return q.refuse("bytes", "engine %s stores %d bytes of requests on this member (request_bytes_per_engine=%d)", engine, u.Bytes, q.MaxBytes)
	}
	if q.total+grow > q.MaxMemberBytes {
		q.prune("", live)
	}
	if q.total+grow > q.MaxMemberBytes {
		return q.refuse("member_bytes", "this member's requests store %d bytes (half of request_store_bytes: %d)", q.total, q.MaxMemberBytes)
	}
	return nil
}

func (q *Quota) refuse(what, format string, args ...any) error {
	q.refused[what]++
	return fmt.Errorf("%w: %s", ErrQuota, fmt.Sprintf(format, args...))
}

// prune forgets engine's requests ("": every engine's) that no longer run.
func (q *Quota) prune(engine string, live func(string) bool) {
	for id, e := range q.byID {
		if (engine == "" || e.engine == engine) && !live(id) {
			q.drop(id, e)
		}
	}
}

func (q *Quota) drop(id string, e quotaEntry) {
	delete(q.byID, id)
	u := q.byEngine[e.engine]
	u.Requests--
	u.Bytes -= e.bytes
	q.total -= e.bytes
	// u stays in byEngine even at zero: callers hold it, and engines are
	// the member's registered ones (few).
}
