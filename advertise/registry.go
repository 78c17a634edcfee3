// Package advertise decides which engines a connexd advertises: the engines
// registered with it through engine.register, each living for its TTL
// unless renewed. It is pure: callers pass the time, and the daemon wires it
// to the API and to the member's heartbeats.
package advertise

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// TTL bounds for a registration.
const (
	// DefaultTTL is used when a registration asks for none.
	DefaultTTL = 3 * time.Second
	// MinTTL and MaxTTL bound what a registration may ask for.
	MinTTL = 500 * time.Millisecond
	MaxTTL = 60 * time.Second
	// MaxEngines bounds the engines one member advertises.
	MaxEngines = 64
)

// Roles an engine may register with.
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// ErrInvalid means a registration's fields are unusable; the message names the field.
var ErrInvalid = errors.New("engines: invalid registration")

// ErrFull means the member already advertises MaxEngines engines.
var ErrFull = errors.New("engines: too many engines registered with this member")

type entry struct {
	info    *messages.EngineInfo
	expires time.Time
}

// Registry is the set of live engine registrations of one member. It is not
// safe for concurrent use; the daemon guards it.
type Registry struct {
	live map[string]entry
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{live: map[string]entry{}} }

// MaxBaseURL bounds a registration's base_url: it travels in every
// heartbeat of its member.
const MaxBaseURL = 2048

// Validate checks a registration and returns the TTL it gets.
func Validate(r *messages.RegisterEngineRequest, validToken func(string) bool) (time.Duration, error) {
	e := r.GetEngine()
	switch {
	case e == nil:
		return 0, fmt.Errorf("%w: engine is missing", ErrInvalid)
	case !validToken(e.GetEngineId()):
		return 0, fmt.Errorf("%w: engine_id %q is not one subject token", ErrInvalid, e.GetEngineId())
	case e.GetRole() != RolePrefill && e.GetRole() != RoleDecode:
		return 0, fmt.Errorf("%w: role %q (allowed: %s, %s)", ErrInvalid, e.GetRole(), RolePrefill, RoleDecode)
	case e.GetModel() == "" || len(e.GetModel()) > 256:
		return 0, fmt.Errorf("%w: model must be 1..256 bytes", ErrInvalid)
	case e.GetBlocksFree() > e.GetBlocksTotal():
		return 0, fmt.Errorf("%w: blocks_free %d exceeds blocks_total %d", ErrInvalid, e.GetBlocksFree(), e.GetBlocksTotal())
	case e.GetInstanceId() != "" && (len(e.GetInstanceId()) > 128 || !validToken(e.GetInstanceId())):
		// Every field here travels in each of the member's heartbeats:
		// none may be large (a heartbeat past NATS's max_payload is never
		// sent, and the member drops out of the cluster).
		return 0, fmt.Errorf("%w: instance_id %q is not one subject token (1-128 bytes)", ErrInvalid, e.GetInstanceId())
	case len(e.GetReasoningParser()) > 64 || !parserName(e.GetReasoningParser()):
		return 0, fmt.Errorf("%w: reasoning_parser %q must be a parser name of at most 64 letters, digits, '_', '-' or '.'", ErrInvalid, e.GetReasoningParser())
	case len(e.GetBaseUrl()) > MaxBaseURL:
		return 0, fmt.Errorf("%w: base_url is %d bytes (at most %d)", ErrInvalid, len(e.GetBaseUrl()), MaxBaseURL)
	}
	if err := checkBaseURL(e.GetBaseUrl()); err != nil {
		return 0, err
	}
	ttl := time.Duration(r.GetTtlMs()) * time.Millisecond
	if ttl == 0 {
		return DefaultTTL, nil
	}
	if ttl < MinTTL || ttl > MaxTTL {
		return 0, fmt.Errorf("%w: ttl_ms %d (allowed %d..%d)", ErrInvalid, r.GetTtlMs(), MinTTL.Milliseconds(), MaxTTL.Milliseconds())
	}
	return ttl, nil
}

// parserName: empty, or letters, digits, '_', '-' and '.' (vLLM's parser
// names: "qwen3", "deepseek_r1", "openai_gptoss").
func parserName(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}

func checkBaseURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%w: base_url %q must be an http(s) URL such as http://10.0.0.7:8100", ErrInvalid, s)
	}
	if strings.HasSuffix(strings.TrimRight(u.Path, "/"), "/v1") {
		return fmt.Errorf("%w: base_url %q must not end in /v1 (the router appends /v1/...)", ErrInvalid, s)
	}
	return nil
}

// Ended names one engine instance that is gone: its requests on this
// member have nobody to continue them.
type Ended struct {
	Engine   string
	Instance string // "" for engines that register without an instance_id
}

// Register adds or refreshes a registration valid for ttl from now. If it
// replaces a registration of another instance of the engine (a restart),
// replaced names that instance. A new engine first makes room by dropping
// the registrations that lapsed: lapsed reports them (as Live does), so
// that the caller ends them — a lapse is never dropped unreported, whoever
// reads the registry first.
func (r *Registry) Register(e *messages.EngineInfo, ttl time.Duration, now time.Time) (replaced *Ended, lapsed []Ended, err error) {
	old, ok := r.live[e.GetEngineId()]
	if !ok {
		lapsed = r.expire(now)
		if len(r.live) >= MaxEngines {
			return nil, lapsed, fmt.Errorf("%w (%d)", ErrFull, MaxEngines)
		}
	} else if old.info.GetInstanceId() != e.GetInstanceId() {
		replaced = &Ended{Engine: e.GetEngineId(), Instance: old.info.GetInstanceId()}
	}
	r.live[e.GetEngineId()] = entry{info: proto.Clone(e).(*messages.EngineInfo), expires: now.Add(ttl)}
	return replaced, lapsed, nil
}

// Instance is the instance id of engine id's live registration ("" if none).
func (r *Registry) Instance(id string) string { return r.live[id].info.GetInstanceId() }

// Info is engine id's live registration (nil if none); callers must not
// modify it.
func (r *Registry) Info(id string) *messages.EngineInfo { return r.live[id].info }

// Remove drops an engine's registration (engine.gone) and reports the
// instance it ended, if there was one.
func (r *Registry) Remove(id string) (Ended, bool) {
	e, ok := r.live[id]
	delete(r.live, id)
	return Ended{Engine: id, Instance: e.info.GetInstanceId()}, ok
}

// RemoveInstance drops engine id's registration only if it is still
// instance's (a probe's verdict must not end a newer instance), and reports
// whether it did.
func (r *Registry) RemoveInstance(id, instance string) (Ended, bool) {
	e, ok := r.live[id]
	if !ok || e.info.GetInstanceId() != instance {
		return Ended{}, false
	}
	delete(r.live, id)
	return Ended{Engine: id, Instance: instance}, true
}

// Live returns the registrations still valid at now, sorted by engine id,
// and drops the lapsed ones. Lapsed reports the instances dropped by this call.
func (r *Registry) Live(now time.Time) (live []*messages.EngineInfo, lapsed []Ended) {
	lapsed = r.expire(now)
	for _, e := range r.live {
		live = append(live, proto.Clone(e.info).(*messages.EngineInfo))
	}
	slices.SortFunc(live, func(a, b *messages.EngineInfo) int { return strings.Compare(a.GetEngineId(), b.GetEngineId()) })
	return live, lapsed
}

// NextExpiry is when the earliest registration lapses (zero if none).
func (r *Registry) NextExpiry() time.Time {
	var first time.Time
	for _, e := range r.live {
		if first.IsZero() || e.expires.Before(first) {
			first = e.expires
		}
	}
	return first
}

func (r *Registry) expire(now time.Time) (lapsed []Ended) {
	for id, e := range r.live {
		if !now.Before(e.expires) {
			delete(r.live, id)
			lapsed = append(lapsed, Ended{Engine: id, Instance: e.info.GetInstanceId()})
		}
	}
	slices.SortFunc(lapsed, func(a, b Ended) int { return strings.Compare(a.Engine, b.Engine) })
	return lapsed
}
