package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	actorcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/connex/connex/natssubject"
)

// ErrStarted is returned when a Provider is started a second time; a
// Provider serves one ActorSystem once.
var ErrStarted = errors.New("cluster: provider already started")

// Provider is a protoactor ClusterProvider backed by NATS: it announces
// this member, watches the others' heartbeats, probes the silent, and keeps
// protoactor's MemberList equal to the live set. It also implements
// Membership for the daemon.
//
// One Provider serves one ActorSystem, once. A member that is restarted, or
// that receives EventSelfEvicted, needs a new ActorSystem (whose id is
// fresh) and a new Provider: protoactor never readmits a removed id.
type Provider struct {
	cfg Config
	nc  *nats.Conn
	log *slog.Logger

	started atomic.Bool
	load    atomic.Int64
	// interval is the heartbeat interval the loop keeps now (nanoseconds),
	// for our probe answers.
	interval atomic.Int64
	activity *Activity // Config.Activity, or one nobody touches
	engines  atomic.Pointer[[]*messages.EngineInfo]
	// announceNow asks the loop for a heartbeat before the next interval
	// (engines changed).
	announceNow chan struct{}
	evicted     atomic.Bool // the others removed us: stay silent
	// left: we announced our graceful leave; probes are answered "left"
	// until our NATS connection closes.
	left   atomic.Bool
	frozen atomic.Bool // test hook: behave like a hung (SIGSTOPped) process

	// Set once by start, read-only afterwards.
	cl   *actorcluster.Cluster
	subj subjects
	self *Member // nil on a client
	// heartbeats decodes the others' heartbeats; only onEvent (the event
	// subscription's goroutine) uses it.
	heartbeats announceDecoder
	inbox      chan any
	done       chan struct{}
	loopDone   chan struct{}
	pingSub    *nats.Subscription
	eventSub   *nats.Subscription
	esSub      *eventstream.Subscription
	stopOnce   sync.Once
	// memberStarted receives the outcome of StartMember (StartMember's
	// wait); buffered, written once.
	memberStarted chan error

	watch watchers
}

var _ actorcluster.ClusterProvider = (*Provider)(nil)

// NewProvider returns a provider that talks over nc, which the caller owns
// and must keep open until Shutdown returns. The connection must not set
// nats.NoEcho: a member hears its own heartbeat back and judges the bus
// by it (while that echo is overdue, nobody's silence counts), and
// heartbeats are filtered by id, not by echo.
func NewProvider(nc *nats.Conn, cfg Config) (*Provider, error) {
	if nc == nil {
		return nil, errors.New("cluster: nil NATS connection")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	act := cfg.Activity
	if act == nil {
		act = NewActivity(nil)
	}
	return &Provider{cfg: cfg, nc: nc, log: cfg.logger(), announceNow: make(chan struct{}, 1), activity: act, memberStarted: make(chan error, 1)}, nil
}

// StartMember joins c as a member: it subscribes to the membership
// subjects, answers probes, heartbeats, and updates c.MemberList on every
// join and leave. protoactor calls it from Cluster.StartMember.
func (p *Provider) StartMember(c *actorcluster.Cluster) error {
	host, port, err := c.ActorSystem.GetHostPort()
	if err != nil {
		return fmt.Errorf("cluster: member address: %w", err)
	}
	kinds := c.GetClusterKinds()
	slices.Sort(kinds)
	self := &Member{ID: c.ActorSystem.ID, Host: host, Port: port, Role: p.cfg.Role, Kinds: kinds, Name: p.cfg.Name}
	err = p.start(c, self)
	select {
	case p.memberStarted <- err:
	default:
	}
	return err
}

// StartClient follows c's membership without joining it: a client neither
// heartbeats nor answers probes, and learns the members within one
// heartbeat interval. protoactor calls it from Cluster.StartClient.
func (p *Provider) StartClient(c *actorcluster.Cluster) error {
	return p.start(c, nil)
}

func (p *Provider) start(c *actorcluster.Cluster, self *Member) error {
	if !natssubject.ValidToken(c.Config.Name) {
		return fmt.Errorf("cluster: cluster name %q is not a NATS subject token", c.Config.Name)
	}
	if !p.started.CompareAndSwap(false, true) {
		return ErrStarted
	}
	if exp := c.Config.HeartbeatExpiration; exp > 0 && exp <= p.cfg.TTL() {
		p.log.Warn("protoactor gossip heartbeat expiration is not longer than the membership TTL; gossip will block members first",
			slog.Duration("gossip", exp), slog.Duration("ttl", p.cfg.TTL()))
	}
	p.cl, p.self = c, self
	p.subj = newSubjects(p.cfg.SubjectPrefix, c.Config.Name)
	p.inbox = make(chan any, 256)
	p.done = make(chan struct{})
	p.loopDone = make(chan struct{})

	v := newView(p.cfg, self)
	// fail undoes the start: a provider that did not start has nothing for
	// Shutdown to stop (no loop to wait for).
	fail := func(err error) error {
		p.unsubscribe()
		p.started.Store(false)
		return err
	}
	var err error
	if self != nil {
		// Subscribe to our ping subject before anyone can learn our id, so
		// that "no responders" always means our connection is gone.
		if p.pingSub, err = p.nc.Subscribe(p.subj.ping(self.ID), p.answerPing); err != nil {
			return fail(fmt.Errorf("cluster: subscribe ping: %w", err))
		}
	}
	if p.eventSub, err = p.nc.Subscribe(p.subj.events(), p.onEvent); err != nil {
		return fail(fmt.Errorf("cluster: subscribe events: %w", err))
	}
	if err := p.nc.FlushTimeout(5 * time.Second); err != nil {
		return fail(fmt.Errorf("cluster: flush subscriptions: %w", err))
	}
	p.esSub = c.ActorSystem.EventStream.Subscribe(p.onActorEvent)
	p.publishSnapshot(v, effects{changed: true})
	c.MemberList.UpdateClusterTopology(toActorMembers(v.liveMembers()))
	go p.run(v)
	p.log.Info("cluster membership started", slog.String("cluster", c.Config.Name),
		slog.String("member", p.selfID()), slog.String("role", string(p.cfg.Role)))
	return nil
}

// Shutdown stops heartbeating. With graceful set, a member announces its
// leave so that the others remove it at once; without, they find it gone
// by probe or TTL. After a graceful leave the member keeps its probe
// subject, answering "left", for a TTL (every peer has dropped it by then)
// or until its NATS connection closes or drains: a peer whose probe
// (protoactor lost the member's gRPC stream while the member stops)
// overtakes the leave notice still learns of a leave, not of a crash.
// Without, it stops answering probes at once. Shutdown is idempotent.
//
// protoactor's Cluster.Shutdown calls it only when graceful (and after it
// has stopped the ActorSystem), and panics on a client: the daemon should
// call Shutdown itself first — see doc.go.
func (p *Provider) Shutdown(graceful bool) error {
	if !p.started.Load() {
		return nil
	}
	var err error
	p.stopOnce.Do(func() {
		close(p.done)
		select {
		case <-p.loopDone:
		case <-time.After(5 * time.Second):
			p.log.Warn("cluster membership loop did not stop within 5s")
		}
		p.cl.ActorSystem.EventStream.Unsubscribe(p.esSub)
		if graceful && p.self != nil && !p.evicted.Load() {
			p.left.Store(true)
			err = p.publish(p.subj.leave(p.self.ID), goneOf(p.self.ID, p.self.ID, ReasonLeave))
			if ferr := p.nc.FlushTimeout(time.Second); err == nil && ferr != nil {
				err = fmt.Errorf("cluster: flush leave: %w", ferr)
			}
			if sub := p.pingSub; sub != nil {
				time.AfterFunc(p.cfg.TTL(), func() { _ = sub.Unsubscribe() })
			}
		} else if p.pingSub != nil {
			_ = p.pingSub.Unsubscribe()
		}
		if p.eventSub != nil {
			_ = p.eventSub.Unsubscribe()
		}
		p.log.Info("cluster membership stopped", slog.String("member", p.selfID()), slog.Bool("graceful", graceful))
	})
	return err
}

func (p *Provider) unsubscribe() {
	for _, s := range []*nats.Subscription{p.pingSub, p.eventSub} {
		if s != nil {
			_ = s.Unsubscribe()
		}
	}
}

// SelfID is this member's cluster id ("" for a client, which is not a
// member). Each provider start picks a fresh one: it names one incarnation
// of the member.
func (p *Provider) SelfID() string { return p.selfID() }

func (p *Provider) selfID() string {
	if p.self == nil {
		return ""
	}
	return p.self.ID
}

// answerPing replies to a liveness probe with our current announce, or
// with the "left" state once we announced our graceful leave.
func (p *Provider) answerPing(msg *nats.Msg) {
	if p.frozen.Load() || p.evicted.Load() {
		return
	}
	var err error
	if p.left.Load() {
		err = msg.RespondMsg(&nats.Msg{Header: nats.Header{probeStateHeader: []string{probeStateLeft}}})
	} else {
		var b []byte
		if b, err = proto.Marshal(announceOf(p.Self(), 0, time.Now())); err == nil {
			err = msg.Respond(b)
		}
	}
	if err != nil {
		p.log.Debug("answer probe", slog.Any("error", err))
	}
}

// onEvent decodes a membership message and hands it to the loop.
func (p *Provider) onEvent(msg *nats.Msg) {
	kind, id, ok := p.subj.parseEvent(msg.Subject)
	if !ok {
		return
	}
	switch kind {
	case kindHeartbeat:
		m, err := p.heartbeats.decode(id, msg.Data)
		if err != nil {
			p.log.Debug("bad heartbeat", slog.String("subject", msg.Subject), slog.Any("error", err))
			return
		}
		p.send(inHeartbeat{m: m})
	case kindLeave:
		p.send(inGone{id: id, reporter: id})
	case kindDead:
		var g messages.MemberGone
		if err := proto.Unmarshal(msg.Data, &g); err != nil {
			p.log.Debug("bad dead notice", slog.String("subject", msg.Subject), slog.Any("error", err))
			return
		}
		reporter := g.GetReporterId()
		if reporter == id {
			reporter = "" // a member cannot report itself dead; that is not a leave
		}
		p.send(inGone{id: id, reporter: reporter})
	}
}

// onActorEvent turns protoactor's "lost the gRPC stream to X" into a hint
// to probe X now. It runs on the publisher's goroutine, possibly inside
// MemberList.UpdateClusterTopology called by our loop, so it never blocks.
func (p *Provider) onActorEvent(evt any) {
	if t, ok := evt.(*remote.EndpointTerminatedEvent); ok {
		select {
		case p.inbox <- inHint{addr: t.Address}:
		default: // the loop is busy; silence and the TTL still catch it
		}
	}
}

// send hands in to the loop unless the provider is stopping.
func (p *Provider) send(in any) {
	select {
	case p.inbox <- in:
	case <-p.done:
	}
}

func (p *Provider) publish(subject string, m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	return p.nc.Publish(subject, b)
}

func toActorMembers(ms []Member) []*actorcluster.Member {
	out := make([]*actorcluster.Member, 0, len(ms))
	for _, m := range ms {
		out = append(out, &actorcluster.Member{Id: m.ID, Host: m.Host, Port: int32(m.Port), Kinds: m.Kinds})
	}
	return out
}
