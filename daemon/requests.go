package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/errcode"
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

func (d *Daemon) askRequest(id string, msg any) (*messages.RequestStatus, error) {
	if err := requireRequestID(id); err != nil {
		return nil, err
	}
	pid, ok := d.reqTable.Lookup(id)
	if !ok {
		return nil, api.Errorf(api.CodeUnknownRequest, "request %s does not run on member %s", id, d.cfg.MemberID)
	}
	st, err := d.askRequestActor(pid, msg)
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

// askRequestActor sends msg to a request actor and waits for its reply.
func (d *Daemon) askRequestActor(pid *actor.PID, msg any) (*messages.RequestStatus, error) {
	res, err := d.system.Root.RequestFuture(pid, msg, askTimeout).Result()
	if err != nil {
		return nil, err
	}
	rep, ok := res.(actors.RequestReply)
	if !ok {
		return nil, api.Errorf(api.CodeInternal, "unexpected reply %T from a request actor", res)
	}
	return rep.Status, rep.Err
}

// spawnRequest starts a request actor with its first message (start or
// adopt); the actor stops itself if that fails.
func (d *Daemon) spawnRequest(first any) (*messages.RequestStatus, error) {
	st, err := d.askRequestActor(d.system.Root.Spawn(actors.RequestProps(d.rdeps)), first)
	d.updateLoad()
	return st, err
}

func (d *Daemon) requestsReady() error {
	if d.reqStore == nil {
		return api.Errorf(api.CodePeerUnavailable, "request actors need JetStream; it is not available: %v", d.reqErr)
	}
	return nil
}

// StartRequest starts a decode request on this member.
func (d *Daemon) StartRequest(ctx context.Context, r *messages.StartRequestMsg) (*messages.RequestStatus, error) {
	if err := acting(ctx, "engine_id", &r.EngineId); err != nil {
		return nil, err
	}
	if err := d.requestsReady(); err != nil {
		return nil, err
	}
	if err := requireRequestID(r.RequestId); err != nil {
		return nil, err
	}
	if err := requireToken("engine_id", r.EngineId); err != nil {
		return nil, err
	}
	inst := d.engineInstance(r.EngineId)
	if _, here := d.reqTable.Lookup(r.RequestId); !here && d.reqTable.Len() >= d.cfg.RequestsMax {
		return nil, api.Errorf(api.CodeOverloaded, "member %s runs %d requests (requests_max=%d)", d.cfg.MemberID, d.reqTable.Len(), d.cfg.RequestsMax)
	}
	if r.Takeover {
		// A request id is a name, not a capability: an engine takes a
		// request over only with the word of the authority that placed
		// it (the router's peer.grant, members only), used once.
		if _, scoped := api.CallerEngine(ctx); scoped && natsAuthenticated(d.cfg) && !d.grants.Take(r.RequestId, r.EngineId, d.now()) {
			return nil, api.Errorf(api.CodeForbidden, "request.start with takeover of request %s by engine %s: no grant from the router that placed it there", r.RequestId, r.EngineId)
		}
		if _, ok := d.reqTable.Lookup(r.RequestId); ok {
			return d.askRequest(r.RequestId, &actors.TakeoverRequest{Msg: r, Instance: inst})
		}
	}
	return d.spawnRequest(&actors.StartRequest{Msg: r, Instance: inst})
}

// Progress appends generated tokens.
func (d *Daemon) Progress(ctx context.Context, r *messages.RequestProgress) (*messages.RequestStatus, error) {
	if err := d.callerOwns(ctx, r.RequestId); err != nil {
		return nil, err
	}
	st, err := d.askRequest(r.RequestId, &actors.RequestProgress{Epoch: r.Epoch, Tokens: r.TokenIds})
	d.updateLoad()
	return st, err
}

// FinishRequest ends a request and releases its hold.
func (d *Daemon) FinishRequest(ctx context.Context, r *messages.FinishRequestMsg) (*messages.RequestStatus, error) {
	if err := d.callerOwns(ctx, r.RequestId); err != nil {
		return nil, err
	}
	st, err := d.askRequest(r.RequestId, &actors.FinishRequest{Epoch: r.Epoch})
	d.updateLoad()
	return st, err
}

// InspectRequest returns a request's state: from its actor if it runs
// here, else from the durable store.
func (d *Daemon) InspectRequest(ctx context.Context, r *messages.RequestRef) (*messages.RequestStatus, error) {
	if err := requireRequestID(r.RequestId); err != nil {
		return nil, err
	}
	if _, ok := d.reqTable.Lookup(r.RequestId); ok {
		if err := d.callerOwns(ctx, r.RequestId); err != nil {
			return nil, err
		}
		return d.askRequest(r.RequestId, &actors.InspectRequest{})
	}
	if err := d.requestsReady(); err != nil {
		return nil, err
	}
	st, _, err := d.reqStore.Get(ctx, r.RequestId)
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
// for requests.GrantTTL.
func (d *Daemon) GrantTakeover(_ context.Context, r *messages.StartRequestMsg) (*messages.RequestStatus, error) {
	if err := requireRequestID(r.RequestId); err != nil {
		return nil, err
	}
	if err := requireToken("engine_id", r.EngineId); err != nil {
		return nil, err
	}
	d.grants.Grant(r.RequestId, r.EngineId, d.now())
	return &messages.RequestStatus{Status: "granted"}, nil
}

// Adopt takes over an orphaned request on this member.
func (d *Daemon) Adopt(_ context.Context, r *messages.AdoptRequestMsg) (*messages.RequestStatus, error) {
	if err := d.requestsReady(); err != nil {
		return nil, err
	}
	if err := requireRequestID(r.RequestId); err != nil {
		return nil, err
	}
	// Only an owner gone from this member's own view may be replaced: a
	// caller cannot fence a live request by claiming its owner died.
	if d.members != nil && d.members.View().Present[r.DeadOwner] {
		return nil, api.Errorf(api.CodeBadRequest, "request %s: owner %s is live in member %s's view; only a departed owner's requests are adopted", r.RequestId, r.DeadOwner, d.cfg.MemberID)
	}
	if d.reqTable.Len() >= d.cfg.RequestsMax {
		return nil, api.Errorf(api.CodeOverloaded, "member %s runs %d requests (requests_max=%d)", d.cfg.MemberID, d.reqTable.Len(), d.cfg.RequestsMax)
	}
	engine := d.decodeEngine()
	if engine == "" {
		return nil, api.Errorf(api.CodeUnknownRegion, "member %s has no registered decode engine to resume request %s on", d.cfg.MemberID, r.RequestId)
	}
	st, err := d.spawnRequest(&actors.AdoptRequest{ID: r.RequestId, DeadOwner: r.DeadOwner, Engine: engine})
	if err == nil && r.DepartedUnixMs > 0 && d.prom != nil {
		// From the coordinator seeing the owner leave to the request
		// running here (clocks of one host, or NTP-close ones).
		d.prom.failover.Observe(max(0, d.now().Sub(time.UnixMilli(r.DepartedUnixMs)).Seconds()))
	}
	return st, err
}

// decodeEngine picks the local engine that resumes adopted requests: the
// smallest engine id with a registered region.
func (d *Daemon) decodeEngine() string {
	engines := d.regions.Engines()
	if len(engines) == 0 {
		return ""
	}
	return engines[0]
}

func (d *Daemon) updateLoad() {
	if d.members != nil {
		d.members.SetLoad(int64(d.reqTable.Len()))
	}
}

// startCoordinator runs this member's orphan coordinator
// (requests.Coordinator) until d.stop: it asks live members over the API
// to adopt departed owners' requests, and adopts its previous run's here.
func (d *Daemon) startCoordinator(interval time.Duration) {
	c := &requests.Coordinator{
		Self:    d.cfg.MemberID,
		Members: d.members,
		Owners:  d.reqStore.Owners,
		Adopt: func(ctx context.Context, a requests.Adoption) error {
			cli := &api.Client{NC: d.Bus.Conn, Member: a.Target}
			msg := &messages.AdoptRequestMsg{RequestId: a.Request, DeadOwner: a.DeadOwner}
			if !a.DepartedAt.IsZero() {
				msg.DepartedUnixMs = a.DepartedAt.UnixMilli()
			}
			_, err := cli.Adopt(ctx, msg)
			return asFenced(err)
		},
		AdoptHere: func(ctx context.Context, req, owner string) error {
			_, err := d.Adopt(ctx, &messages.AdoptRequestMsg{RequestId: req, DeadOwner: owner})
			return asFenced(err)
		},
		Running: func(req string) bool {
			_, ok := d.reqTable.Lookup(req)
			return ok
		},
		Interval: interval,
		Log:      d.log,
	}
	d.wg.Add(2)
	go func() {
		defer d.wg.Done()
		c.Run(d.stop)
	}()
	go func() {
		defer d.wg.Done()
		d.purgeRequestMarkers()
	}()
}

// markerSweepTimeout bounds the one sweep of old delete markers at start.
const markerSweepTimeout = 5 * time.Minute

// purgeRequestMarkers removes, once, the delete markers finished requests
// left in the request bucket before finishes purged them (an upgrade, or a
// failed purge), so that the orphan scans stop reading them now rather
// than after request_ttl_s. It gives up when connexd stops.
func (d *Daemon) purgeRequestMarkers() {
	ctx, cancel := context.WithTimeout(context.Background(), markerSweepTimeout)
	defer cancel()
	go func() {
		select {
		case <-d.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	n, err := d.reqStore.PurgeMarkers(ctx)
	select {
	case <-d.stop:
		return
	default:
	}
	switch {
	case err != nil:
		d.log.Warn("purging old delete markers from the request bucket failed; they expire after request_ttl_s", "purged", n, "err", err)
	case n > 0:
		d.log.Info("purged old delete markers from the request bucket", "purged", n)
	}
}

// asFenced makes an error with the API code fenced (someone adopted the
// request already) one the coordinator recognises: requests.ErrFenced.
func asFenced(err error) error {
	if err != nil && !errors.Is(err, requests.ErrFenced) && errcode.Of(err) == api.CodeFenced {
		return fmt.Errorf("%w: %w", requests.ErrFenced, err)
	}
	return err
}
