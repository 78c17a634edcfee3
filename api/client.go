package api

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// Client calls one member's API over NATS. Engine shims written in Go,
// connexd's own pullers (member to member) and tests use it.
type Client struct {
	NC     *nats.Conn
	Member string // target member id
	// Engine, if set, calls in that engine's scope
	// (connex.v1.<member>.e.<engine>.<ep>): what an engine shim does, and
	// the only subjects an engine's credentials may publish on. Empty
	// calls in the member scope (members, admins, and buses without
	// authentication).
	Engine string
	JSON   bool // send JSON instead of protobuf
}

// ErrNoResponders wraps NATS's no-responders error: the member is not running.
var ErrNoResponders = errors.New("api: member not reachable")

// Call sends in to endpoint ep and decodes the reply into out. API failures
// come back as *Error.
func (c *Client) Call(ctx context.Context, ep string, in, out proto.Message) error {
	subj := c.subject(ep)
	msg, err := c.request(subj, in)
	if err != nil {
		return err
	}
	reply, err := c.NC.RequestMsgWithContext(ctx, msg)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return noResponders(ep, c.Member, err) // nothing received it: callers may send it again
		}
		if LinkDown(err) {
			// The call may or may not have left: as for a timeout, a
			// caller that sends it again must be able to (peer_unavailable).
			e := Errorf(CodePeerUnavailable, "%s on member %s: the NATS connection: %v", ep, c.Member, err)
			e.Cause = err
			return e
		}
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
			// A publish the server's permissions refuse is dropped and
			// reported asynchronously: say so rather than "timeout".
			if le := c.NC.LastError(); errors.Is(le, nats.ErrPermissionViolation) && strings.Contains(le.Error(), `"`+subj+`"`) {
				return Errorf(CodeForbidden, "%s on member %s: the NATS server refused it to these credentials: %v", ep, c.Member, le)
			}
			return Errorf(CodeTimeout, "%s on member %s: %v", ep, c.Member, err)
		}
		return fmt.Errorf("api: %s on member %s: %w", ep, c.Member, err)
	}
	return decodeReply(ep, reply, out)
}

// LinkDown reports whether err says the NATS connection could not carry a
// call for now (draining, reconnecting with its buffer full, disconnected):
// the call may or may not have left, and may be sent again once the link
// is back. Call answers such errors with CodePeerUnavailable. A closed
// connection is not one: it never comes back (the caller is shutting
// down), and trying again would loop.
func LinkDown(err error) bool {
	for _, e := range []error{nats.ErrConnectionDraining, nats.ErrConnectionReconnecting, nats.ErrReconnectBufExceeded, nats.ErrDisconnected} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// subject is where c calls endpoint ep: in its engine's scope when it has
// one and ep is engine-scoped.
func (c *Client) subject(ep string) string {
	if c.Engine != "" && EngineScoped(ep) {
		return EngineSubject(c.Member, c.Engine, ep)
	}
	return Subject(c.Member, ep)
}

// RegisterRegion registers an engine's KV region file.
func (c *Client) RegisterRegion(ctx context.Context, r *messages.RegisterRegionRequest) (*messages.RegionInfo, error) {
	out := new(messages.RegionInfo)
	return out, c.Call(ctx, EpRegionRegister, r, out)
}

// CreateRegion has the member allocate a KV region for an engine; the
// engine maps the reply's path (regionfile.Attach).
func (c *Client) CreateRegion(ctx context.Context, r *messages.CreateRegionRequest) (*messages.RegionInfo, error) {
	out := new(messages.RegionInfo)
	return out, c.Call(ctx, EpRegionCreate, r, out)
}

// InspectRegion returns a region's block accounting.
func (c *Client) InspectRegion(ctx context.Context, r *messages.RegionRef) (*messages.RegionInfo, error) {
	out := new(messages.RegionInfo)
	return out, c.Call(ctx, EpRegionInspect, r, out)
}

// EngineGone tells the member an engine went away.
func (c *Client) EngineGone(ctx context.Context, r *messages.EngineGoneRequest) (*messages.EngineGoneReply, error) {
	out := new(messages.EngineGoneReply)
	return out, c.Call(ctx, EpEngineGone, r, out)
}

// RegisterEngine registers or refreshes an engine (role, model, HTTP base
// URL, load) with the member; it travels in the member's heartbeats, and
// lapses unless renewed within the reply's ttl_ms.
func (c *Client) RegisterEngine(ctx context.Context, r *messages.RegisterEngineRequest) (*messages.RegisterEngineReply, error) {
	out := new(messages.RegisterEngineReply)
	return out, c.Call(ctx, EpEngineRegister, r, out)
}

// EngineNotices replays an engine's notices after a sequence number.
func (c *Client) EngineNotices(ctx context.Context, r *messages.NoticesRequest) (*messages.NoticesReply, error) {
	out := new(messages.NoticesReply)
	return out, c.Call(ctx, EpEngineNotices, r, out)
}

// EngineState returns what the member keeps for an engine: holds, pulls
// in flight, requests and the notice journal's position.
func (c *Client) EngineState(ctx context.Context, r *messages.EngineStateRequest) (*messages.EngineState, error) {
	out := new(messages.EngineState)
	return out, c.Call(ctx, EpEngineState, r, out)
}

// MemberStatus returns everything the member keeps: engines, holds,
// requests, pulls in flight.
func (c *Client) MemberStatus(ctx context.Context, r *messages.MemberStatusRequest) (*messages.MemberStatus, error) {
	out := new(messages.MemberStatus)
	return out, c.Call(ctx, EpMemberStatus, r, out)
}

// CreateHold holds blocks after prefill and returns the kv_transfer_params.
func (c *Client) CreateHold(ctx context.Context, r *messages.CreateHoldRequest) (*messages.CreateHoldReply, error) {
	out := new(messages.CreateHoldReply)
	return out, c.Call(ctx, EpHoldCreate, r, out)
}

// Renew extends a hold's lease.
func (c *Client) Renew(ctx context.Context, r *messages.HoldRef) (*messages.HoldStatus, error) {
	out := new(messages.HoldStatus)
	return out, c.Call(ctx, EpHoldRenew, r, out)
}

// Release ends a hold; its blocks are freed once no pull reads them.
func (c *Client) Release(ctx context.Context, r *messages.HoldRef) (*messages.HoldStatus, error) {
	out := new(messages.HoldStatus)
	return out, c.Call(ctx, EpHoldRelease, r, out)
}

// Inspect returns a hold's status.
func (c *Client) Inspect(ctx context.Context, r *messages.HoldRef) (*messages.HoldStatus, error) {
	out := new(messages.HoldStatus)
	return out, c.Call(ctx, EpHoldInspect, r, out)
}

// StartPull starts a pull into a local region; completion is a PullDone notice.
func (c *Client) StartPull(ctx context.Context, r *messages.StartPullRequest) (*messages.StartPullReply, error) {
	out := new(messages.StartPullReply)
	return out, c.Call(ctx, EpPullStart, r, out)
}

// Descriptors starts reading a hold on its holding member (member to member).
func (c *Client) Descriptors(ctx context.Context, r *messages.DescriptorsRequest) (*messages.Descriptors, error) {
	out := new(messages.Descriptors)
	return out, c.Call(ctx, EpPeerDescriptors, r, out)
}

// PullEnd tells the holding member a pull stopped reading.
func (c *Client) PullEnd(ctx context.Context, r *messages.PullEnd) (*messages.HoldStatus, error) {
	out := new(messages.HoldStatus)
	return out, c.Call(ctx, EpPeerPullEnd, r, out)
}

// StartRequest starts a decode request on the member.
func (c *Client) StartRequest(ctx context.Context, r *messages.StartRequestMsg) (*messages.RequestStatus, error) {
	out := new(messages.RequestStatus)
	return out, c.Call(ctx, EpRequestStart, r, out)
}

// Progress appends generated tokens to a request (checkpointed durably).
func (c *Client) Progress(ctx context.Context, r *messages.RequestProgress) (*messages.RequestStatus, error) {
	out := new(messages.RequestStatus)
	return out, c.Call(ctx, EpRequestProgress, r, out)
}

// FinishRequest ends a request and releases its hold.
func (c *Client) FinishRequest(ctx context.Context, r *messages.FinishRequestMsg) (*messages.RequestStatus, error) {
	out := new(messages.RequestStatus)
	return out, c.Call(ctx, EpRequestFinish, r, out)
}

// InspectRequest returns a request's durable state.
func (c *Client) InspectRequest(ctx context.Context, r *messages.RequestRef) (*messages.RequestStatus, error) {
	out := new(messages.RequestStatus)
	return out, c.Call(ctx, EpRequestInspect, r, out)
}

// GrantTakeover tells member that r.EngineId may take request r.RequestId
// over there (peer.grant; members only: the router before a resumed leg).
func (c *Client) GrantTakeover(ctx context.Context, r *messages.StartRequestMsg) (*messages.RequestStatus, error) {
	out := new(messages.RequestStatus)
	return out, c.Call(ctx, EpPeerGrant, r, out)
}

// Adopt asks a member to take over an orphaned request (member to member).
func (c *Client) Adopt(ctx context.Context, r *messages.AdoptRequestMsg) (*messages.RequestStatus, error) {
	out := new(messages.RequestStatus)
	return out, c.Call(ctx, EpPeerAdopt, r, out)
}
