package daemon

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
)

// Members is what the request layer needs from cluster membership: what
// the orphan coordinator needs (requests.Membership) and this member's
// advertised load.
type Members interface {
	requests.Membership
	// SetLoad sets the in-flight request count the next heartbeat
	// advertises (placement by load).
	SetLoad(load int64)
}

// requestAPI answers the decode request calls (request.start, progress,
// finish, inspect, adopt, peer.grant) over the request actors running here.
// It owns the takeover grants.
type requestAPI struct {
	member        string // member_id
	max           int    // requests_max
	authenticated bool   // NATS authentication: takeovers need a grant
	actors        requestActors
	// store reads requests' durable state; nil when JetStream is
	// unavailable (storeErr says why) and the request API is off.
	store     requestStore
	storeErr  error
	instances engineInstances
	local     localEngines
	// members is this member's view and load; nil without membership.
	members memberView
	grants  requests.Grants
	// quota bounds each engine's live requests and stored tokens here,
	// and this member's share of the request store.
	quota *requests.Quota
	clock clock.Clock
	// adopted observes the time from an owner's departure to its request
	// adopted here (seconds); nil when metrics are off.
	adopted func(seconds float64)
	// reservations reserves a started request's read of its hold ahead of
	// its pull.start and drops it when the request finishes
	// (pull/reserve.go); nil: none.
	reservations pullReserver
	// starts tells pulls sent beside their request's start (await_start)
	// how it ended (startgate.go); nil: none wait.
	starts *startGate
	// headAhead reads a granted takeover's request ahead of the engine's
	// request.start (headahead.go) when it is not moved ahead; nil: not
	// read ahead.
	headAhead *headAhead
	// tryBackground runs a grant's move ahead of its takeover (the
	// daemon's tracked goroutines; false once connexd is stopping); nil:
	// grants move nothing ahead.
	tryBackground func(func()) bool
	log           *slog.Logger
}

// pullReserver reserves reads ahead of their pulls (pull.PullDeps).
type pullReserver interface {
	// reserve is called once request.start of request by engine, whose
	// hold params names, has been answered running.
	reserve(engine, request string, params *messages.KVTransferParams)
	// unreserve drops what is left of request's reservation.
	unreserve(request string)
}

// requestActors reaches the request actors running here (requestactors.go).
type requestActors interface {
	lookup(id string) (*actor.PID, bool)
	running() int
	all() []*actor.PID
	// ask sends msg to a request actor and waits for its reply.
	ask(pid *actor.PID, msg any) (*messages.RequestStatus, error)
	// spawn starts a request actor with its first message (start or
	// adopt); the actor stops itself if that fails.
	spawn(first any) (*messages.RequestStatus, error)
	send(pid *actor.PID, msg any)
}

// engineInstances is the instance id of an engine's live registration
// (engineAPI).
type engineInstances interface {
	engineInstance(id string) string
}

// localEngines lists the engines with a registered region here, in order
// (kvmem.RegionTable.Engines).
type localEngines interface {
	Engines() []string
}

// memberView is what requests read of membership: who is in the view, and
// where this member's load is advertised.
type memberView interface {
	View() requests.View
	SetLoad(load int64)
}

func (a *requestAPI) askRequest(id string, msg any) (*messages.RequestStatus, error) {
	if err := requireRequestID(id); err != nil {
		return nil, err
	}
	pid, ok := a.actors.lookup(id)
	if !ok {
		return nil, api.Errorf(api.CodeUnknownRequest, "request %s does not run on member %s", id, a.member)
	}
	st, err := a.actors.ask(pid, msg)
	if errors.Is(err, actor.ErrDeadLetter) || errors.Is(err, actor.ErrTimeout) {
		return nil, api.Errorf(api.CodeUnknownRequest, "request %s: %v", id, err)
	}
	return st, err
}

// requireRequestID refuses an id that cannot name a request (427).
func requireRequestID(id string) error {
	if !requests.ValidID(id) {
		return api.Errorf(api.CodeBadRequest, "request_id=%q: want 1-128 letters, digits, '-', '_', '=' or '/'", id)
	}
	return nil
}

func (a *requestAPI) spawnRequest(first any) (*messages.RequestStatus, error) {
	st, err := a.actors.spawn(first)
	a.updateLoad()
	return st, err
}

func (a *requestAPI) requestsReady() error {
	if a.store == nil {
		return api.Errorf(api.CodePeerUnavailable, "request actors need JetStream; it is not available: %v", a.storeErr)
	}
	return nil
}

// StartRequest starts a decode request on this member. A pull of its hold
// by its engine sent with await_start reads once it is answered.
func (a *requestAPI) StartRequest(ctx context.Context, r *messages.StartRequestMsg) (_ *messages.RequestStatus, err error) {
	// The engine the caller acts for keys the outcome for its pulls: an
	// engine's starts never open or fail another engine's pulls.
	if err := acting(ctx, "engine_id", &r.EngineId); err != nil {
		return nil, err
	}
	engine, transfer, id := r.EngineId, r.GetParams().GetTransferId(), r.StartId
	if a.starts == nil || id == "" || len(id) > maxStartID || !transferIDRe.MatchString(transfer) {
		// No pull waits for it (a pull.start naming a malformed transfer
		// or start id is refused anyway).
		return a.startRequest(ctx, r)
	}
	a.starts.begin(engine, transfer, id)
	defer func() {
		if p := recover(); p != nil { // the service answers it; the pull fails
			a.starts.end(engine, transfer, id, api.Errorf(api.CodeInternal, "request.start failed: %v", p))
			panic(p)
		}
		a.starts.end(engine, transfer, id, err)
	}()
	return a.startRequest(ctx, r)
}

// startRequest is StartRequest once the caller's engine is known.
func (a *requestAPI) startRequest(ctx context.Context, r *messages.StartRequestMsg) (*messages.RequestStatus, error) {
	if err := a.requestsReady(); err != nil {
		return nil, err
	}
	if err := requireRequestID(r.RequestId); err != nil {
		return nil, err
	}
	if err := requireToken("engine_id", r.EngineId); err != nil {
		return nil, err
	}
	// The request actor renews and releases the hold on the holder's
	// subjects with this member's rights: the holder must be one subject
	// token, or an engine's word would direct them elsewhere.
	if err := requireToken("params.remote_ctrl.member", r.GetParams().GetRemoteCtrl().GetMember()); err != nil {
		return nil, err
	}
	// A transfer id no holder could answer for is refused now, not kept
	// renewing in vain (a well-formed one naming no hold ends the request
	// at its first renewal: requests/activation).
	if !transferIDRe.MatchString(r.GetParams().GetTransferId()) {
		return nil, api.Errorf(api.CodeBadRequest, "params.transfer_id=%q: want 32 lowercase hex digits", r.GetParams().GetTransferId())
	}
	inst := a.instances.engineInstance(r.EngineId)
	if _, here := a.actors.lookup(r.RequestId); !here && a.actors.running() >= a.max {
		return nil, api.Errorf(api.CodeOverloaded, "member %s runs %d requests (requests_max=%d)", a.member, a.actors.running(), a.max)
	}
	if r.Takeover {
		// A request id is a name, not a capability: an engine takes a
		// request over only with the word of the authority that placed
		// it (the router's peer.grant, members only), used once.
		if _, scoped := api.CallerEngine(ctx); scoped && a.authenticated && !a.grants.Take(r.RequestId, r.EngineId, a.clock.Now()) {
			return nil, api.Errorf(api.CodeForbidden, "request.start with takeover of request %s by engine %s: no grant from the router that placed it there", r.RequestId, r.EngineId)
		}
		if _, ok := a.actors.lookup(r.RequestId); ok {
			return a.takeOverHere(r, inst)
		}
	}
	if _, here := a.actors.lookup(r.RequestId); here && !r.Takeover {
		// Its actor would refuse it (the id is claimed); refused here,
		// before the quota would count another engine's running request
		// as this engine's (a request id is a name anyone may send).
		return nil, api.Errorf(api.CodeRequestExists, "request.start of %s: %v on this member (a resume sends takeover)", r.RequestId, requests.ErrExists)
	}
	// One engine may not fill the cluster's one request bucket: its own
	// starts are refused (429) at its quota, no one else's.
	if err := a.quota.Start(r.RequestId, r.EngineId, len(r.PromptTokenIds), a.live); err != nil {
		return nil, api.Errorf(api.CodeOverloaded, "request.start of %s: %v", r.RequestId, err)
	}
	st, err := a.spawnRequest(&actors.StartRequest{Msg: r, Instance: inst})
	if err != nil {
		if _, ok := a.actors.lookup(r.RequestId); !ok {
			a.quota.End(r.RequestId)
		} else if r.Takeover && errors.Is(err, requests.ErrExists) {
			// The router's grant moved it here meanwhile (moveAhead): its
			// actor claimed the id first, and this start confirms it.
			return a.takeOverHere(r, inst)
		}
	}
	a.reserve(r, err)
	return st, err
}

// takeOverHere sends an engine's takeover to the request's actor on this
// member: one the router's grant moved here (the takeover confirms it), or
// one another local engine runs (the takeover moves it).
func (a *requestAPI) takeOverHere(r *messages.StartRequestMsg, inst string) (*messages.RequestStatus, error) {
	// Counted for its engine now, with its tokens (a grant's move counted
	// none; another engine's request moves to this one).
	if err := a.quota.Start(r.RequestId, r.EngineId, len(r.PromptTokenIds), a.live); err != nil {
		return nil, api.Errorf(api.CodeOverloaded, "request.start of %s: %v", r.RequestId, err)
	}
	st, err := a.askRequest(r.RequestId, &actors.TakeoverRequest{Msg: r, Instance: inst})
	a.reserve(r, err)
	return st, err
}

// reserve reserves the read of the hold of request r, started here without
// error (err), ahead of its engine's pull.start: the request's durable
// state names the engine by now, so the holder binds the hold to it before
// it registers the read.
func (a *requestAPI) reserve(r *messages.StartRequestMsg, err error) {
	if err == nil && a.reservations != nil {
		a.reservations.reserve(r.EngineId, r.RequestId, r.Params)
	}
}

// live reports whether request id still runs here (Quota's question).
func (a *requestAPI) live(id string) bool {
	_, ok := a.actors.lookup(id)
	return ok
}

// Progress appends generated tokens.
func (a *requestAPI) Progress(ctx context.Context, r *messages.RequestProgress) (*messages.RequestStatus, error) {
	if err := a.callerOwns(ctx, r.RequestId); err != nil {
		return nil, err
	}
	if len(r.TokenIds) > requests.MaxGenerated {
		return nil, api.Errorf(api.CodeBadRequest, "request.progress of %s: %d tokens in one call (at most %d)", r.RequestId, len(r.TokenIds), requests.MaxGenerated)
	}
	if err := a.quota.Grow(r.RequestId, len(r.TokenIds), a.live); err != nil {
		return nil, api.Errorf(api.CodeOverloaded, "request.progress of %s: %v", r.RequestId, err)
	}
	st, err := a.askRequest(r.RequestId, &actors.RequestProgress{Epoch: r.Epoch, Tokens: r.TokenIds})
	if err != nil {
		_ = a.quota.Grow(r.RequestId, -len(r.TokenIds), a.live) // giving back never fails
	}
	a.updateLoad()
	return st, err
}

// FinishRequest ends a request and releases its hold.
func (a *requestAPI) FinishRequest(ctx context.Context, r *messages.FinishRequestMsg) (*messages.RequestStatus, error) {
	if err := a.callerOwns(ctx, r.RequestId); err != nil {
		return nil, err
	}
	if a.reservations != nil {
		// Before the actor releases the hold: an unused reservation's read
		// would keep the release waiting.
		a.reservations.unreserve(r.RequestId)
	}
	st, err := a.askRequest(r.RequestId, &actors.FinishRequest{Epoch: r.Epoch})
	if err == nil {
		a.quota.End(r.RequestId)
	}
	a.updateLoad()
	return st, err
}

// InspectRequest returns a request's state: from its actor if it runs
// here, else from the durable store.
func (a *requestAPI) InspectRequest(ctx context.Context, r *messages.RequestRef) (*messages.RequestStatus, error) {
	if err := requireRequestID(r.RequestId); err != nil {
		return nil, err
	}
	if _, ok := a.actors.lookup(r.RequestId); ok {
		if err := a.callerOwns(ctx, r.RequestId); err != nil {
			return nil, err
		}
		return a.askRequest(r.RequestId, &actors.InspectRequest{})
	}
	if err := a.requestsReady(); err != nil {
		return nil, err
	}
	st, _, err := a.store.Get(ctx, r.RequestId)
	if err != nil {
		return nil, err
	}
	if caller, ok := api.CallerEngine(ctx); ok && st.GetEngineId() != caller {
		return nil, api.Errorf(api.CodeForbidden, "request %s belongs to another engine than %q", r.RequestId, caller)
	}
	return &messages.RequestStatus{State: st, Status: "stored"}, nil
}

// GrantTakeover records the router's word that engine r.EngineId may take
// request r.RequestId over on this member (peer.grant, member scope only),
// for as long as the router asked (requests.GrantLifetime).
func (a *requestAPI) GrantTakeover(_ context.Context, r *messages.StartRequestMsg) (*messages.RequestStatus, error) {
	if err := requireRequestID(r.RequestId); err != nil {
		return nil, err
	}
	if err := requireToken("engine_id", r.EngineId); err != nil {
		return nil, err
	}
	ttl := requests.GrantLifetime(r.GrantTtlMs)
	a.grants.Grant(r.RequestId, r.EngineId, ttl, a.clock.Now())
	if _, here := a.actors.lookup(r.RequestId); !here && !a.moveAhead(r.RequestId, r.EngineId, ttl) && a.headAhead != nil {
		// The engine's takeover comes next and reads the request first.
		a.headAhead.ahead(r.RequestId)
	}
	return &messages.RequestStatus{Status: "granted"}, nil
}

// moveAhead moves request id to local engine engine when the router's
// grant arrives, in the background (activation.Grant: read, compare-and-set
// at the next epoch, the hold bound to the engine, the engine's pull
// reserved), so that the engine's takeover milliseconds later only
// confirms it and its pull finds the hold bound. False when it cannot: no
// request store, this member full, the engine has no region here, its
// quota reached. What the move cannot do, the engine's takeover does as
// it would without it.
func (a *requestAPI) moveAhead(id, engine string, ttl time.Duration) bool {
	if a.store == nil || a.tryBackground == nil || a.actors.running() >= a.max {
		return false
	}
	if !slices.Contains(a.local.Engines(), engine) || a.quota.Start(id, engine, 0, a.live) != nil {
		return false // an engine with no region here pulls nothing here
	}
	inst := a.instances.engineInstance(engine)
	started := a.tryBackground(func() {
		st, err := a.spawnRequest(&actors.GrantRequest{ID: id, Engine: engine, Instance: inst, TTL: ttl})
		if err != nil {
			if _, ok := a.actors.lookup(id); !ok {
				a.quota.End(id)
			}
			a.log.Debug("granted request not moved ahead; the engine's takeover will", "request", id, "engine", engine, "err", err)
			return
		}
		if a.reservations != nil {
			a.reservations.reserve(engine, id, st.GetState().GetParams())
		}
	})
	if !started {
		a.quota.End(id)
	}
	return started
}

// Adopt takes over an orphaned request on this member.
func (a *requestAPI) Adopt(_ context.Context, r *messages.AdoptRequestMsg) (*messages.RequestStatus, error) {
	if err := a.requestsReady(); err != nil {
		return nil, err
	}
	if err := requireRequestID(r.RequestId); err != nil {
		return nil, err
	}
	// Only an owner gone from this member's own view may be replaced: a
	// caller cannot fence a live request by claiming its owner died.
	if a.members != nil && a.members.View().Present[r.DeadOwner] {
		return nil, api.Errorf(api.CodeBadRequest, "request %s: owner %s is live in member %s's view; only a departed owner's requests are adopted", r.RequestId, r.DeadOwner, a.member)
	}
	if a.actors.running() >= a.max {
		return nil, api.Errorf(api.CodeOverloaded, "member %s runs %d requests (requests_max=%d)", a.member, a.actors.running(), a.max)
	}
	engine := a.decodeEngine()
	if engine == "" {
		return nil, api.Errorf(api.CodeUnknownRegion, "member %s has no registered decode engine to resume request %s on", a.member, r.RequestId)
	}
	st, err := a.spawnRequest(&actors.AdoptRequest{ID: r.RequestId, DeadOwner: r.DeadOwner, Engine: engine})
	if err == nil && r.DepartedUnixMs > 0 && a.adopted != nil {
		// From the coordinator seeing the owner leave to the request
		// running here (clocks of one host, or NTP-close ones).
		a.adopted(max(0, a.clock.Now().Sub(time.UnixMilli(r.DepartedUnixMs)).Seconds()))
	}
	return st, err
}

// decodeEngine picks the local engine that resumes adopted requests: the
// smallest engine id with a registered region.
func (a *requestAPI) decodeEngine() string {
	engines := a.local.Engines()
	if len(engines) == 0 {
		return ""
	}
	return engines[0]
}

func (a *requestAPI) updateLoad() {
	if a.members != nil {
		a.members.SetLoad(int64(a.actors.running()))
	}
}

// callerOwns refuses an engine-scoped call about a request of another
// engine: an epoch is a small number, so knowing a request id and guessing
// its epoch must not let one engine write another's request.
func (a *requestAPI) callerOwns(ctx context.Context, requestID string) error {
	caller, ok := api.CallerEngine(ctx)
	if !ok {
		return nil
	}
	st, err := a.askRequest(requestID, &actors.InspectRequest{})
	if err != nil {
		return err
	}
	if st.GetState().GetEngineId() != caller {
		return api.Errorf(api.CodeForbidden, "request %s belongs to another engine than %q", requestID, caller)
	}
	return nil
}

// endEngine tells every request actor here that an engine instance is
// gone (actors.EngineLost): each that ran on it and was not taken over
// ends.
func (a *requestAPI) endEngine(engine, instance string) {
	for _, pid := range a.actors.all() {
		a.actors.send(pid, &actors.EngineLost{Engine: engine, Instance: instance})
	}
}

// states is the state of every request running here of engine ("":
// every engine's); a request that does not answer is left out.
func (a *requestAPI) states(engine string) []*messages.RequestState {
	var out []*messages.RequestState
	for _, pid := range a.actors.all() {
		rep, err := a.actors.ask(pid, &actors.InspectRequest{})
		if err == nil && rep.GetState() != nil && (engine == "" || rep.GetState().GetEngineId() == engine) {
			out = append(out, rep.GetState())
		}
	}
	return out
}
