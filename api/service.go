package api

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"
)

// Handler implements the endpoints. Methods are called concurrently, each
// with a context that ends at the request's deadline. Returning an *Error
// (or an error ServeOptions.Errors maps) picks the error code. Two are on a
// pull's critical path and skip the goroutine the others run on: StartPull
// runs on its endpoint's subscription goroutine and must never block, and
// Descriptors must not block either but answers through its Answer,
// from any goroutine, when it has the answer.
type Handler interface {
	RegisterRegion(context.Context, *messages.RegisterRegionRequest) (*messages.RegionInfo, error)
	CreateRegion(context.Context, *messages.CreateRegionRequest) (*messages.RegionInfo, error)
	InspectRegion(context.Context, *messages.RegionRef) (*messages.RegionInfo, error)
	EngineGone(context.Context, *messages.EngineGoneRequest) (*messages.EngineGoneReply, error)
	RegisterEngine(context.Context, *messages.RegisterEngineRequest) (*messages.RegisterEngineReply, error)
	EngineNotices(context.Context, *messages.NoticesRequest) (*messages.NoticesReply, error)
	EngineState(context.Context, *messages.EngineStateRequest) (*messages.EngineState, error)
	MemberStatus(context.Context, *messages.MemberStatusRequest) (*messages.MemberStatus, error)
	CreateHold(context.Context, *messages.CreateHoldRequest) (*messages.CreateHoldReply, error)
	Renew(context.Context, *messages.HoldRef) (*messages.HoldStatus, error)
	Release(context.Context, *messages.HoldRef) (*messages.HoldStatus, error)
	Inspect(context.Context, *messages.HoldRef) (*messages.HoldStatus, error)
	StartPull(context.Context, *messages.StartPullRequest) (*messages.StartPullReply, error)
	Descriptors(context.Context, *messages.DescriptorsRequest, Answer[*messages.Descriptors])
	PullEnd(context.Context, *messages.PullEnd) (*messages.HoldStatus, error)
	StartRequest(context.Context, *messages.StartRequestMsg) (*messages.RequestStatus, error)
	Progress(context.Context, *messages.RequestProgress) (*messages.RequestStatus, error)
	FinishRequest(context.Context, *messages.FinishRequestMsg) (*messages.RequestStatus, error)
	InspectRequest(context.Context, *messages.RequestRef) (*messages.RequestStatus, error)
	Adopt(context.Context, *messages.AdoptRequestMsg) (*messages.RequestStatus, error)
	GrantTakeover(context.Context, *messages.StartRequestMsg) (*messages.RequestStatus, error)
}

// DefaultMaxRequestBytes is the request payload bound of a service whose
// ServeOptions leave MaxRequestBytes at 0 (connexd's max_request_bytes
// default).
const DefaultMaxRequestBytes = 256 << 10

// ServeOptions tune the service.
type ServeOptions struct {
	Member  string // subject group connex.v1.<Member>
	Version string // service version reported by $SRV.INFO
	// MaxRequestBytes bounds a request's payload: larger ones get
	// CodeTooLarge. 0 (or less): DefaultMaxRequestBytes.
	MaxRequestBytes int
	MaxInFlight     int // concurrent handlers; beyond it CodeOverloaded
	// MaxInFlightPerEngine bounds the concurrent handlers of one engine's
	// calls (engine-scoped subjects), within MaxInFlight; beyond it that
	// engine gets CodeOverloaded. 0: a quarter of MaxInFlight.
	MaxInFlightPerEngine int
	Timeout              time.Duration // per-request handler deadline
	Logger               *slog.Logger
	// Stats, if set, is reported as every endpoint's "data" in
	// $SRV.STATS.connex (`nats micro stats connex`): the daemon's counters.
	Stats func() any
	// Errors turns a handler's error into the code and message its caller
	// gets (connexd: errcode.AsError, which knows the domain packages'
	// errors); nil: AsError, where only *Error keep their codes.
	Errors func(error) *Error
	// EngineInbox, if set, is the reply-subject prefix of each engine (its
	// credentials' inbox, auth.Identity.InboxPrefix): a call on an
	// engine-scoped subject whose reply subject lies outside
	// EngineInbox(engine)+"." is dropped unanswered, so connexd (a member,
	// which may publish anywhere) never publishes on an engine's say-so
	// outside that engine's own scope. Nil (no NATS authentication)
	// answers any reply subject.
	EngineInbox func(engine string) string
}

// Serve registers the "connex" micro service on nc with every endpoint under
// connex.v1.<member>. Stop the returned service to unsubscribe.
func Serve(nc *nats.Conn, h Handler, o ServeOptions) (micro.Service, error) {
	if !ValidToken(o.Member) {
		return nil, fmt.Errorf("api: member id %q cannot be a subject token", o.Member)
	}
	if o.MaxRequestBytes <= 0 {
		o.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 1024
	}
	if o.MaxInFlightPerEngine <= 0 {
		o.MaxInFlightPerEngine = max(o.MaxInFlight/4, 1)
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Errors == nil {
		o.Errors = AsError
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        ServiceName,
		Version:     o.Version,
		Description: "Connex KV hold/pull API of member " + o.Member,
		Metadata:    map[string]string{"member": o.Member, "api": Version},
		StatsHandler: func(*micro.Endpoint) any {
			if o.Stats == nil {
				return nil
			}
			return o.Stats()
		},
	})
	if err != nil {
		return nil, fmt.Errorf("api: add service: %w", err)
	}
	s := &server{o: o, sem: make(chan struct{}, o.MaxInFlight), engines: &engineSlots{max: o.MaxInFlightPerEngine}, maxPayload: int(nc.MaxPayload())}
	eps := []struct {
		name string
		fn   micro.HandlerFunc
	}{
		{EpRegionRegister, endpoint(s, h.RegisterRegion)},
		{EpRegionCreate, endpoint(s, h.CreateRegion)},
		{EpRegionInspect, endpoint(s, h.InspectRegion)},
		{EpEngineGone, endpoint(s, h.EngineGone)},
		{EpEngineRegister, endpoint(s, h.RegisterEngine)},
		{EpEngineNotices, endpoint(s, h.EngineNotices)},
		{EpEngineState, endpoint(s, h.EngineState)},
		{EpMemberStatus, endpoint(s, h.MemberStatus)},
		{EpHoldCreate, endpoint(s, h.CreateHold)},
		{EpHoldRenew, endpoint(s, h.Renew)},
		{EpHoldRelease, endpoint(s, h.Release)},
		{EpHoldInspect, endpoint(s, h.Inspect)},
		{EpPullStart, inlineEndpoint(s, h.StartPull)},
		{EpPeerDescriptors, deferredEndpoint(s, h.Descriptors)},
		{EpPeerPullEnd, endpoint(s, h.PullEnd)},
		{EpRequestStart, endpoint(s, h.StartRequest)},
		{EpRequestProgress, endpoint(s, h.Progress)},
		{EpRequestFinish, endpoint(s, h.FinishRequest)},
		{EpRequestInspect, endpoint(s, h.InspectRequest)},
		{EpPeerAdopt, endpoint(s, h.Adopt)},
		{EpPeerGrant, endpoint(s, h.GrantTakeover)},
	}
	for _, ep := range eps {
		name := strings.ReplaceAll(ep.name, ".", "_")
		if err := svc.AddEndpoint(name, ep.fn, micro.WithEndpointSubject(Subject(o.Member, ep.name)), micro.WithEndpointQueueGroupDisabled()); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("api: add endpoint %s: %w", ep.name, err)
		}
		if !EngineScoped(ep.name) {
			continue
		}
		// The engine scope: the same handler, told who called by the
		// subject's engine token.
		if err := svc.AddEndpoint("e_"+name, scoped(s, o.Member, ep.name, ep.fn), micro.WithEndpointSubject(EngineSubject(o.Member, "*", ep.name)), micro.WithEndpointQueueGroupDisabled()); err != nil {
			_ = svc.Stop()
			return nil, fmt.Errorf("api: add endpoint e.*.%s: %w", ep.name, err)
		}
	}
	return svc, nil
}

// scoped wraps an endpoint served on connex.v1.<member>.e.*.<ep>: it
// takes the calling engine from the subject and hands it to the handler
// through the request's context (CallerEngine).
func scoped(s *server, member, ep string, fn micro.HandlerFunc) micro.HandlerFunc {
	head, tail := Prefix+"."+member+".e.", "."+ep
	return func(req micro.Request) {
		engine, ok := strings.CutPrefix(req.Subject(), head)
		if ok {
			engine, ok = strings.CutSuffix(engine, tail)
		}
		if !ok || !ValidToken(engine) {
			if s.o.EngineInbox == nil {
				s.fail(req, Errorf(CodeBadRequest, "subject %q: the engine token is not a valid id", req.Subject()))
			}
			return
		}
		if !s.replyAllowed(engine, req.Reply()) {
			// Answering would publish where the engine says, with a
			// member's rights: another engine's notices, the request
			// bucket, the cluster's events. Nobody is told; the log says
			// so at most once a minute an engine (an engine sending them
			// in a loop must not flood the member's log).
			if n, ok := s.dropped.note(engine, time.Now()); ok {
				s.o.Logger.Warn("api calls dropped: their reply subject is outside the calling engine's inbox", "engine", engine, "dropped", n, "subject", req.Subject(), "reply", req.Reply())
			}
			return
		}
		fn(callerRequest{Request: req, engine: engine})
	}
}

// callerRequest carries the caller through micro's Request interface to
// the endpoint adapter.
type callerRequest struct {
	micro.Request
	engine string
}

type server struct {
	dropped    dropLog
	o          ServeOptions
	sem        chan struct{}
	engines    *engineSlots // each engine's share of sem
	maxPayload int          // the server's max_payload; a larger reply cannot be sent
}

// endpoint adapts a typed handler: it decodes, bounds concurrency, runs the
// handler on its own goroutine (so one slow request does not stall the
// endpoint's subscription) and encodes the reply or error.
func endpoint[Req any, PReq interface {
	*Req
	proto.Message
}, Rep proto.Message](s *server, fn func(context.Context, PReq) (Rep, error)) micro.HandlerFunc {
	return func(req micro.Request) {
		in, isJSON, ok := decode[Req, PReq](s, req)
		if !ok || !s.admit(req) {
			return
		}
		go func() {
			defer s.release(req)
			defer s.recoverPanic(req)
			ctx, cancel := context.WithTimeout(context.Background(), s.o.Timeout)
			defer cancel()
			out, err := fn(callerContext(ctx, req), in)
			s.answer(req, isJSON, out, err)
		}()
	}
}

// inlineEndpoint adapts a typed handler that never blocks (no I/O, no
// waiting on another goroutine): it runs on the endpoint's subscription
// goroutine, which saves a pull.start the hand-off to a goroutine of its
// own, and is not counted against MaxInFlight.
func inlineEndpoint[Req any, PReq interface {
	*Req
	proto.Message
}, Rep proto.Message](s *server, fn func(context.Context, PReq) (Rep, error)) micro.HandlerFunc {
	return func(req micro.Request) {
		in, isJSON, ok := decode[Req, PReq](s, req)
		if !ok {
			return
		}
		defer s.recoverPanic(req)
		out, err := fn(callerContext(context.Background(), req), in)
		s.answer(req, isJSON, out, err)
	}
}

// Answer answers a request of a deferred endpoint (Handler.Descriptors):
// the first call sends the reply or error, later ones do nothing. Safe from
// any goroutine.
type Answer[Rep proto.Message] func(Rep, error)

// deferredEndpoint adapts a handler that starts its work without blocking
// and answers later through an Answer, from whichever goroutine finishes it
// (peer.descriptors: the hold actor answers the NATS request itself, with
// no goroutine waiting for it in between). The request counts against
// MaxInFlight until answered; one not answered within the service's
// Timeout is answered with CodeTimeout.
func deferredEndpoint[Req any, PReq interface {
	*Req
	proto.Message
}, Rep proto.Message](s *server, fn func(context.Context, PReq, Answer[Rep])) micro.HandlerFunc {
	return func(req micro.Request) {
		in, isJSON, ok := decode[Req, PReq](s, req)
		if !ok || !s.admit(req) {
			return
		}
		var answered atomic.Bool
		finish := func(out Rep, err error) bool {
			if !answered.CompareAndSwap(false, true) {
				return false
			}
			s.answer(req, isJSON, out, err)
			s.release(req)
			return true
		}
		timer := time.AfterFunc(s.o.Timeout, func() {
			var none Rep
			finish(none, Errorf(CodeTimeout, "%s: not answered within %s", req.Subject(), s.o.Timeout))
		})
		answer := func(out Rep, err error) {
			if finish(out, err) {
				timer.Stop()
			}
		}
		defer func() {
			if r := recover(); r != nil {
				s.o.Logger.Error("api handler panicked", "subject", req.Subject(), "panic", r)
				var none Rep
				answer(none, Errorf(CodeInternal, "handler panicked: %v", r))
			}
		}()
		fn(callerContext(context.Background(), req), in, answer)
	}
}

// decode reads req's content type and payload into a new Req; on failure
// it answers req with the error and returns ok=false.
func decode[Req any, PReq interface {
	*Req
	proto.Message
}](s *server, req micro.Request) (in PReq, isJSON, ok bool) {
	isJSON, cerr := contentType(req.Headers())
	if cerr != nil {
		s.fail(req, cerr)
		return nil, false, false
	}
	in = PReq(new(Req))
	if derr := Unmarshal(req.Data(), isJSON, s.o.MaxRequestBytes, in); derr != nil {
		s.fail(req, derr)
		return nil, false, false
	}
	return in, isJSON, true
}

// admit takes one of MaxInFlight slots for req (and of its engine's
// MaxInFlightPerEngine, for an engine's call), or answers it
// CodeOverloaded and returns false; release gives them back.
func (s *server) admit(req micro.Request) bool {
	cr, scoped := req.(callerRequest)
	if scoped && !s.engines.take(cr.engine) {
		s.fail(req, Errorf(CodeOverloaded, "engine %s has more than %d calls in flight on member %s (its share)", cr.engine, s.o.MaxInFlightPerEngine, s.o.Member))
		return false
	}
	select {
	case s.sem <- struct{}{}:
		return true
	default:
		if scoped {
			s.engines.give(cr.engine)
		}
		s.fail(req, Errorf(CodeOverloaded, "more than %d requests in flight", s.o.MaxInFlight))
		return false
	}
}

func (s *server) release(req micro.Request) {
	<-s.sem
	if cr, ok := req.(callerRequest); ok {
		s.engines.give(cr.engine)
	}
}

// recoverPanic, deferred, answers req with CodeInternal when its handler
// panicked.
func (s *server) recoverPanic(req micro.Request) {
	if r := recover(); r != nil {
		s.o.Logger.Error("api handler panicked", "subject", req.Subject(), "panic", r)
		s.fail(req, Errorf(CodeInternal, "handler panicked: %v", r))
	}
}

// callerContext is ctx carrying the calling engine of an engine-scoped
// request (CallerEngine).
func callerContext(ctx context.Context, req micro.Request) context.Context {
	if cr, ok := req.(callerRequest); ok {
		return withCaller(ctx, cr.engine)
	}
	return ctx
}

// answer sends a handler's result as req's reply: out encoded as the
// request was, or err as its code and message.
func (s *server) answer(req micro.Request, isJSON bool, out proto.Message, err error) {
	if err != nil {
		s.fail(req, s.o.Errors(err))
		return
	}
	data, err := Marshal(out, isJSON)
	if err != nil {
		s.fail(req, Errorf(CodeInternal, "encode %s: %v", describe(out), err))
		return
	}
	if s.maxPayload > 0 && len(data)+1024 > s.maxPayload {
		// NATS would refuse to publish it and the caller would only
		// see a timeout; say why instead.
		s.fail(req, Errorf(CodeTooLarge, "reply %s of %d bytes exceeds the NATS server's max_payload (%d); for descriptors: the hold has too many separate extents (use fewer, more contiguous blocks, or raise max_payload)", describe(out), len(data), s.maxPayload))
		return
	}
	// A protobuf reply goes without headers: a reply without a content
	// type is protobuf (as a request is), and a header is a parse at the
	// caller and an encode here on every call. A JSON reply says so.
	var opts []micro.RespondOpt
	if isJSON {
		opts = append(opts, micro.WithHeaders(micro.Headers{HeaderContentType: {ContentJSON}}))
	}
	if err := req.Respond(data, opts...); err != nil {
		s.o.Logger.Warn("api respond failed", "subject", req.Subject(), "err", err)
	}
}

// replyAllowed reports whether a call of engine may be answered on reply.
func (s *server) replyAllowed(engine, reply string) bool {
	if s.o.EngineInbox == nil {
		return true
	}
	return ReplyInScope(s.o.EngineInbox(engine), reply)
}

// ReplyInScope reports whether reply is a subject under inbox (an
// identity's inbox prefix): inbox + "." + at least one more token, and no
// wildcard.
func ReplyInScope(inbox, reply string) bool {
	rest, ok := strings.CutPrefix(reply, inbox+".")
	return ok && rest != "" && !strings.ContainsAny(reply, "*> \t\r\n")
}

func (s *server) fail(req micro.Request, e *Error) {
	s.o.Logger.Debug("api request failed", "subject", req.Subject(), "code", int(e.Code), "err", e.Msg)
	if err := respondError(req, e); err != nil {
		s.o.Logger.Warn("api error respond failed", "subject", req.Subject(), "err", err)
	}
}
