package lease

import (
	"errors"
	"fmt"
	"sort"
	"time"
)

// Errors returned by Step. Callers map them to the API's stable codes.
var (
	ErrExpired = errors.New("lease: transfer expired")
	// ErrReleased refuses a hold that was released, pulled (after_pull),
	// shut down or aborted.
	ErrReleased   = errors.New("lease: transfer released")
	ErrEngineGone = errors.New("lease: engine gone")
	ErrNotYours   = errors.New("lease: not allowed for this requester")
	// ErrStaleBinding refuses a Rebind whose epoch is not newer than the
	// binding's.
	ErrStaleBinding = errors.New("lease: stale consumer binding")
	ErrUnknownPull  = errors.New("lease: unknown pull")
	ErrDuplicate    = errors.New("lease: pull id already in use")
	ErrBadConfig    = errors.New("lease: bad configuration")
)

// Mode says when a hold gives its blocks back.
type Mode int

const (
	// OnFinish keeps the blocks until released or expired, so a failed
	// decode can pull them again. The default.
	OnFinish Mode = iota
	// AfterPull frees the blocks after the first successful pull, as other
	// connectors do.
	AfterPull
)

// ParseMode parses "on_finish" or "after_pull".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "on_finish":
		return OnFinish, nil
	case "after_pull":
		return AfterPull, nil
	}
	return 0, fmt.Errorf("%w: release=%q, allowed: on_finish, after_pull", ErrBadConfig, s)
}

// String is the mode as the release config key spells it.
func (m Mode) String() string {
	if m == AfterPull {
		return "after_pull"
	}
	return "on_finish"
}

// State is where a hold is in its lifecycle.
type State int

// States; Released and those after it are terminal (the blocks were
// freed). Their names (String) are the wire's: HoldStatus.state and the
// BlocksFreed notice's reason.
const (
	Held State = iota
	Releasing
	Expiring
	Released
	Expired
	Pulled
	EngineGone
	// ShutDown: the daemon stopped (Shutdown).
	ShutDown
	// Aborted: the hold's owner stopped for another reason (Abort).
	Aborted
	// Unclaimed: no reader claimed the hold (a pull, a renewal or a
	// binding) within Config.Claim of its creation.
	Unclaimed
)

var stateNames = [...]string{"held", "releasing", "expiring", "released", "expired", "pulled", "engine_gone", "shutdown", "aborted", "unclaimed"}

// String is the state's name in status replies, tombstones and the
// BlocksFreed notice's reason ("held", "released", "expired", …).
func (s State) String() string { return stateNames[s] }

// Terminal reports whether the blocks were freed.
func (s State) Terminal() bool { return s >= Released }

// Config fixes a hold at creation.
type Config struct {
	Retain   time.Duration // lease length; every renew and pull restarts it
	Mode     Mode
	Owner    string // engine that owns the blocks; may always release
	Consumer string // if set, the only engine allowed to pull, renew or release besides Owner
	// Claim, if positive and shorter than Retain, is how long the hold
	// waits for its first claim — a PullStart, a Renew or a Rebind, which
	// a decode engine makes as soon as it takes the request up — before it
	// frees its blocks as Unclaimed. A request whose decode leg never
	// happened (the decode engine refused it or was unreachable, the
	// client left between the legs) then costs its prefill engine Claim,
	// not Retain. Once claimed, the lease is Retain as always.
	Claim time.Duration
}

// Hold is the lease state machine of one transfer. Not safe for concurrent
// use: one actor owns it.
type Hold struct {
	cfg      Config
	state    State
	deadline time.Time // lease deadline while Held
	// pulls maps a running pull's id to its reader and deadline; nil until
	// the first pull (most of a live hold's life has none, and an empty
	// map cost each of 100k holds ~50 bytes: make bench-holds).
	pulls     map[string]pull
	pullsDone int
	freed     bool
	// request and bindEpoch are the request and its epoch of the last
	// Rebind ("" and 0: unbound, or the binding of Config.Consumer at
	// creation).
	request   string
	bindEpoch uint64
	// claimed: a PullStart, Renew or Rebind arrived (see Config.Claim).
	claimed bool
	// releasedByPull is set when an after_pull hold's first successful pull
	// ended while other pulls still ran: it ends as Pulled, not Released.
	releasedByPull bool
}

// pull is one running read of the hold.
type pull struct {
	by       string
	deadline time.Time
}

// New creates a held lease at now.
func New(now time.Time, cfg Config) (*Hold, error) {
	if cfg.Retain <= 0 {
		return nil, fmt.Errorf("%w: retain must be > 0, got %s", ErrBadConfig, cfg.Retain)
	}
	h := &Hold{cfg: cfg, deadline: now.Add(cfg.Retain)}
	if cfg.Claim > 0 && cfg.Claim < cfg.Retain {
		h.deadline = now.Add(cfg.Claim)
	} else {
		h.claimed = true // no claim deadline: the lease alone bounds the hold
	}
	return h, nil
}

// Step applies ev and returns the effects to perform. On error no state
// changed except what Tick-style time passage implies (an expired lease is
// noticed by any event, not only Tick).
func (h *Hold) Step(ev Event) ([]Effect, error) {
	var fx []Effect
	now := eventTime(ev)
	fx = h.advance(now, fx)
	switch e := ev.(type) {
	case Tick:
		return fx, nil
	case EngineGoneEvent:
		if h.state.Terminal() {
			return fx, h.terminalErr()
		}
		return h.finish(EngineGone, h.endReads(fx)), nil
	case Shutdown:
		if h.state.Terminal() {
			return fx, nil
		}
		return h.finish(ShutDown, h.endReads(fx)), nil
	case Abort:
		if h.state.Terminal() {
			return fx, nil
		}
		return h.finish(Aborted, h.endReads(fx)), nil
	case Rebind:
		if err := h.live(h.cfg.Consumer, false); err != nil {
			return fx, err
		}
		if err := h.rebind(e); err != nil {
			return fx, err
		}
		h.claim(e.Now)
		return fx, nil
	case Renew:
		if err := h.live(e.By, false); err != nil {
			return fx, err
		}
		h.claimed = true
		h.deadline = e.Now.Add(h.cfg.Retain)
		return fx, nil
	case PullStart:
		if err := h.live(e.By, false); err != nil {
			return fx, err
		}
		if e.PullID == "" {
			return fx, fmt.Errorf("%w: %q", ErrDuplicate, e.PullID)
		}
		if p, dup := h.pulls[e.PullID]; dup {
			// The same reader asking again: its first start's answer was
			// lost (a NATS server died under it). The pull stands as it
			// was started; the lease is renewed.
			if p.by != e.By {
				return fx, fmt.Errorf("%w: %q", ErrDuplicate, e.PullID)
			}
			h.deadline = e.Now.Add(h.cfg.Retain)
			return fx, nil
		}
		if h.pulls == nil {
			h.pulls = map[string]pull{}
		}
		h.pulls[e.PullID] = pull{by: e.By, deadline: e.Deadline}
		h.claimed = true
		h.deadline = e.Now.Add(h.cfg.Retain)
		return append(fx, BeginRead{PullID: e.PullID}), nil
	case PullEnd:
		p, ok := h.pulls[e.PullID]
		if !ok {
			return fx, fmt.Errorf("%w: %q", ErrUnknownPull, e.PullID)
		}
		if p.by != e.By {
			return fx, fmt.Errorf("%w: pull %q was started by %q, not %q", ErrNotYours, e.PullID, p.by, e.By)
		}
		delete(h.pulls, e.PullID)
		fx = append(fx, EndRead{PullID: e.PullID})
		if e.OK {
			h.pullsDone++
		}
		if h.state == Held {
			h.deadline = e.Now.Add(h.cfg.Retain)
			if e.OK && h.cfg.Mode == AfterPull {
				h.state = Releasing
				return h.drain(Pulled, fx), nil
			}
			return fx, nil
		}
		return h.drain(h.pendingReason(), fx), nil
	case Release:
		if err := h.live(e.By, true); err != nil {
			return fx, err
		}
		h.state = Releasing
		return h.drain(Released, fx), nil
	}
	return fx, fmt.Errorf("lease: unknown event %T", ev)
}

// rebind applies a Rebind (see Rebind for the rules).
func (h *Hold) rebind(e Rebind) error {
	switch {
	case e.Consumer == "" || e.Request == "":
		return fmt.Errorf("%w: a binding names a consumer and a request", ErrBadConfig)
	case h.request == "" && h.cfg.Consumer != "" && e.Consumer != h.cfg.Consumer && e.Epoch <= 1:
		// Bound at creation: a request's first activation binds it only
		// for that consumer; a later one (a takeover, which the router
		// granted) may arrive before the first activation's binding.
		return fmt.Errorf("%w: %q", ErrNotYours, e.Consumer)
	case h.request != "" && e.Request != h.request:
		return fmt.Errorf("%w: %q", ErrNotYours, e.Consumer)
	case h.request != "" && e.Consumer != h.cfg.Consumer && e.Epoch <= h.bindEpoch:
		return fmt.Errorf("%w: epoch %d, bound at %d", ErrStaleBinding, e.Epoch, h.bindEpoch)
	}
	h.cfg.Consumer, h.request, h.bindEpoch = e.Consumer, e.Request, max(h.bindEpoch, e.Epoch)
	return nil
}

// claim marks the hold claimed; the first claim turns the claim deadline
// into the lease's.
func (h *Hold) claim(now time.Time) {
	if !h.claimed {
		h.claimed = true
		h.deadline = now.Add(h.cfg.Retain)
	}
}

// advance applies the passage of time: abandon overdue pulls, expire the lease.
func (h *Hold) advance(now time.Time, fx []Effect) []Effect {
	if h.state.Terminal() {
		return fx
	}
	var overdue []string
	for id, p := range h.pulls {
		if !now.Before(p.deadline) {
			overdue = append(overdue, id)
		}
	}
	sort.Strings(overdue)
	for _, id := range overdue {
		delete(h.pulls, id)
		fx = append(fx, EndRead{PullID: id}, PullAbandoned{PullID: id})
	}
	if h.state == Held && !now.Before(h.deadline) {
		if !h.claimed { // no pull ever started: nothing reads the blocks
			return h.finish(Unclaimed, fx)
		}
		h.state = Expiring
	}
	if h.state != Held {
		fx = h.drain(h.pendingReason(), fx)
	}
	return fx
}

// pendingReason is the terminal state a draining hold will reach.
func (h *Hold) pendingReason() State {
	switch h.state {
	case Expiring:
		return Expired
	case Releasing:
		if h.releasedByPull {
			return Pulled
		}
		return Released
	}
	return h.state
}

// drain frees the blocks once no pull reads them.
func (h *Hold) drain(reason State, fx []Effect) []Effect {
	if reason == Pulled {
		h.releasedByPull = true
	}
	if len(h.pulls) > 0 || h.state.Terminal() {
		return fx
	}
	return h.finish(reason, fx)
}

// endReads ends every running pull's read, in pull id order: the hold ends
// under them.
func (h *Hold) endReads(fx []Effect) []Effect {
	ids := make([]string, 0, len(h.pulls))
	for id := range h.pulls {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		fx = append(fx, EndRead{PullID: id})
	}
	h.pulls = nil
	return fx
}

// finish ends the hold in reason; the blocks are freed once, by the first
// ending.
func (h *Hold) finish(reason State, fx []Effect) []Effect {
	h.state = reason
	if h.freed {
		return fx
	}
	h.freed = true
	return append(fx, Deregister{}, Free{Reason: reason, Notify: reason != EngineGone})
}

// live checks that the hold accepts renewals, pulls or a release from by.
func (h *Hold) live(by string, release bool) error {
	switch h.state {
	case Held:
	case Expiring, Expired, Unclaimed:
		return ErrExpired
	case EngineGone:
		return ErrEngineGone
	default:
		return ErrReleased
	}
	if h.cfg.Consumer != "" && by != h.cfg.Consumer && !(release && by == h.cfg.Owner) {
		return fmt.Errorf("%w: %q", ErrNotYours, by)
	}
	return nil
}

func (h *Hold) terminalErr() error {
	switch h.state {
	case Expired, Unclaimed:
		return ErrExpired
	case EngineGone:
		return ErrEngineGone
	}
	return ErrReleased
}

// NextWake is when the owner must deliver a Tick: the lease deadline while
// held, else the earliest running pull's deadline. ok is false once the hold
// is terminal.
func (h *Hold) NextWake() (at time.Time, ok bool) {
	if h.state.Terminal() {
		return time.Time{}, false
	}
	if h.state == Held {
		at = h.deadline
	}
	for _, p := range h.pulls {
		if at.IsZero() || p.deadline.Before(at) {
			at = p.deadline
		}
	}
	return at, !at.IsZero()
}

// Status is a read-only snapshot of a hold.
type Status struct {
	State       State
	Mode        Mode
	Deadline    time.Time // lease deadline; meaningful while Held
	ActivePulls int
	PullsDone   int
	Freed       bool
	// Consumer is the engine the hold serves ("" while unbound), and
	// Request the request it is bound to ("" before the first Rebind).
	Consumer, Request string
}

// Retain is the lease length: every renewal and pull restarts it.
func (h *Hold) Retain() time.Duration { return h.cfg.Retain }

// Status returns a snapshot.
func (h *Hold) Status() Status {
	return Status{State: h.state, Mode: h.cfg.Mode, Deadline: h.deadline, ActivePulls: len(h.pulls), PullsDone: h.pullsDone, Freed: h.freed, Consumer: h.cfg.Consumer, Request: h.request}
}
