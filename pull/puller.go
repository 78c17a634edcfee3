package pull

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/errcode"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
	"github.com/nats-io/nats.go"
)

// PullDeps is what puller actors need from their daemon.
type PullDeps struct {
	Backend transport.Backend
	NC      *nats.Conn
	Notify  func(*messages.PullDone) // publishes on the engine's pull.done subject
	// Clock reads the time and paces renewals and descriptor re-asks; nil
	// is the system clock. The data plane's deadlines (contexts) are the
	// system clock's.
	Clock   clock.Clock
	Log     *slog.Logger
	Metrics *actors.Metrics
	// LoadFailurePolicy is copied into every PullDone ("fail" or "recompute").
	LoadFailurePolicy string
	// Ctx, when cancelled, aborts every pull's reads (daemon shutdown:
	// protoactor's ActorSystem.Shutdown stops no actor). Nil: never.
	Ctx context.Context
	// Holders, when set, ends a pull as soon as cluster membership says its
	// holder left (peer_unavailable) rather than at the stall deadline; the
	// daemon feeds it membership's departures. Nil: only the deadlines.
	Holders *HolderWatch
	// Go runs f in the background (a puller's reads, and the PullEnd it
	// does not wait for), so that the daemon can wait for them on shutdown
	// before it closes the data plane and NATS; nil runs f on a plain
	// goroutine.
	Go func(f func())

	// addrs holds the data address each member last advertised in its
	// descriptors: a puller connects early (before the descriptors come)
	// only to one of these, never to an address the transfer params alone
	// name, since params come from engines and routers.
	addrs dataAddrBook
	// translations keeps the translations between holders' and local
	// layouts of other shapes.
	translations translationCache
	// reserved holds the reads reserved at holders ahead of their pulls
	// (reserve.go).
	reserved reservations
}

func (d *PullDeps) clock() clock.Clock { return clock.Or(d.Clock) }

func (d *PullDeps) goBackground(f func()) {
	if d.Go != nil {
		d.Go(f)
		return
	}
	go f()
}

// Pull is one pull's order. The daemon has validated it, claimed the
// destination blocks (BeginWrite) and acquired the region; the puller gives
// both back when the reads are over.
type Pull struct {
	ID        string
	Params    *messages.KVTransferParams
	Dst       *kvmem.Mapped
	DstBlocks []uint32
	// Skip is how many leading blocks of the hold the pull leaves out
	// (their tokens are in the destination already); DstBlocks are the
	// rest's.
	Skip int
	// Pick, when set, is the positions of the hold's list the pull reads,
	// in order (a hold of several KV cache groups, each less its cached
	// blocks: StartPullRequest.group_skip_blocks); Skip is 0 then.
	Pick    []int
	Timeout time.Duration // the whole pull
	// Ctx, if set, ends the pull early when done (its engine went away:
	// engine.gone); nil: only PullDeps.Ctx does. It must end when
	// PullDeps.Ctx does.
	Ctx           context.Context
	Stall         time.Duration // descriptors must come within this; reads fail after this long without progress (stallwatch.go)
	ReleaseRegion func()
}

// puller runs one pull: a plain goroutine (drive), not an actor. Its
// decisions are pullMachine's; drive performs the machine's effects
// (descriptors requests, the reads, renewals, PullEnd, the PullDone
// notice) and turns their results, its timer and the pull's context into
// the machine's events. Nothing else ever sends it a message: what ends a
// pull early (connexd shutting down, its holder leaving the cluster) ends
// its context (PullDeps.Ctx, HolderWatch).
type puller struct {
	// readDur is how long the data-plane reads took (set by the read's
	// goroutine before it reports readDone, read by finish after it).
	readDur time.Duration
	// descDur (start to descriptors in hand) and endDur (the awaited
	// PullEnd) are the rest of the pull's control plane: PullDone reports
	// them for make bench-pull's breakdown.
	descDur, endDur time.Duration
	deps            *PullDeps
	p               *Pull
	start           time.Time

	// asks carries the pull's peer.descriptors requests, the first one
	// sent by StartPuller (nil with asksErr when it could not be) or, for
	// a pull that took a reservation, by Reserve at askedAt.
	asks    *api.Asks
	asksErr error
	askedAt time.Time
	// req is the read at the holder: the pull's own (its id), or the
	// reservation's (re-asks and the PullEnd name the read by its id).
	req *messages.DescriptorsRequest
}

// StartPuller starts the goroutine that runs p (on deps.Go). A pull that
// fits a reservation (reserve.go: its engine's request.start reserved the
// read) takes it, and with it the holder's answer, there already or on its
// way; any other sends its first peer.descriptors request to the holder
// first, from the caller's goroutine, so that it is on the wire before
// anything else of the pull happens (the caller's answer to pull.start,
// planning the reads): the holder's round trip is most of a small pull's
// time. A request that could not be sent fails the pull, as PullDone says.
func StartPuller(deps *PullDeps, p *Pull) {
	pl := &puller{deps: deps, p: p}
	timeout := p.Timeout
	if r := deps.takeReservation(p, deps.clock().Now()); r != nil {
		deps.Metrics.ReservationsTaken.Add(1)
		pl.asks, pl.req, pl.askedAt = r.asks, r.req, r.sent
		// The reads end before the holder abandons the reserved read.
		timeout = min(timeout, r.deadline.Sub(deps.clock().Now()))
	} else {
		pl.req = descriptorsRequest(p)
		pl.asks, pl.asksErr = postDescriptors(deps, p, pl.req)
	}
	pl.start = deps.clock().Now()
	deps.Metrics.PullsStarted.Add(1)
	base := cmp.Or[context.Context](p.Ctx, deps.Ctx, context.Background())
	ctx, cancel := context.WithTimeout(base, timeout)
	// On the daemon's background group: Close cancels the reads
	// (Deps.Ctx), then waits for them to wind down, for the PullDone
	// notice and for the PullEnd.
	deps.goBackground(func() {
		defer cancel()
		pl.drive(ctx)
	})
}

// postDescriptors subscribes the answers to p's descriptors requests and
// sends the first, req.
func postDescriptors(deps *PullDeps, p *Pull, req *messages.DescriptorsRequest) (*api.Asks, error) {
	peer := &api.Client{NC: deps.NC, Member: p.Params.RemoteCtrl.GetMember()}
	asks, err := peer.NewAsks(api.EpPeerDescriptors)
	if err != nil {
		return nil, err
	}
	if err := asks.Post(req); err != nil {
		asks.Close()
		return nil, err
	}
	return asks, nil
}

// descriptorsRequest is p's peer.descriptors request: the holder registers
// the pull and answers with the hold's descriptors.
func descriptorsRequest(p *Pull) *messages.DescriptorsRequest {
	return &messages.DescriptorsRequest{
		TransferId: p.Params.TransferId, Requester: p.Dst.Engine, PullId: p.ID, RequestId: p.Params.ConnexRequestId,
		Layout: actors.LayoutToProto(p.Dst.Region.Layout), TimeoutMs: uint32(p.Timeout / time.Millisecond),
	}
}

// finish publishes the pull's PullDone notice.
func (a *puller) finish(n uint64, err error) {
	done := &messages.PullDone{
		PullId: a.p.ID, TransferId: a.p.Params.TransferId, Ok: err == nil,
		EngineId: a.p.Dst.Engine, RegionId: a.p.Dst.ID, KvLoadFailurePolicy: a.deps.LoadFailurePolicy,
		DurationUs: uint64(a.deps.clock().Now().Sub(a.start) / time.Microsecond), RequestId: a.p.Params.ConnexRequestId,
		ReadUs: uint64(a.readDur / time.Microsecond), DescriptorsUs: uint64(a.descDur / time.Microsecond),
		PullEndUs: uint64(a.endDur / time.Microsecond),
	}
	if err != nil {
		e := errcode.AsError(err)
		done.ErrorCode, done.Error = uint32(e.Code), e.Msg
		a.deps.Metrics.PullsFailed.Add(1)
		a.deps.Log.Info("pull failed", "pull", a.p.ID, "transfer", a.p.Params.TransferId, "request", done.RequestId, "engine", a.p.Dst.Engine,
			"code", int(e.Code), "err", e.Msg, "duration_us", done.DurationUs)
	} else {
		done.Bytes = n
		a.deps.Metrics.PullsOK.Add(1)
		a.deps.Log.Info("pull done", "pull", a.p.ID, "transfer", a.p.Params.TransferId, "request", done.RequestId, "engine", a.p.Dst.Engine,
			"bytes", n, "duration_us", done.DurationUs)
		a.deps.Metrics.BytesPulled.Add(int64(n))
	}
	a.deps.Notify(done)
}

// readResult is what the reads' goroutine reports.
type readResult struct {
	n   uint64
	err error
}

// drive runs the pull to its end: it performs pullMachine's effects and
// feeds it events until it is done. It gives back the destination blocks
// and the region reference before the PullDone notice (an engine that
// reads it may start the next pull into the same blocks at once), and in
// any case before returning.
func (a *puller) drive(ctx context.Context) {
	var plan *readPlan
	giveBack := sync.OnceFunc(func() {
		plan.release() // the reads are over: every Get has returned
		a.p.Dst.Blocks.EndWrite(a.p.DstBlocks)
		a.p.ReleaseRegion()
	})
	defer giveBack()
	defer func() {
		if a.asks != nil {
			a.asks.Close() // the reservation's asks may have given way to the pull's own
		}
	}()
	prm := a.p.Params
	peer := &api.Client{NC: a.deps.NC, Member: prm.RemoteCtrl.GetMember()}
	requester := a.p.Dst.Engine
	clk := a.deps.clock()
	// The holder's departure from the cluster cancels everything below
	// with a *HolderLeftError.
	ctx, endWatch, bindHolder := a.deps.watchHolder(ctx, peer.Member)
	defer endWatch()
	m, fx := newPullMachine(clk.Now(), pullConfig{
		ID: a.p.ID, Member: peer.Member, Stall: a.p.Stall, Retain: time.Duration(prm.RetainS) * time.Second, AskErr: a.asksErr,
		Reserved: !a.askedAt.IsZero(), AskedAt: a.askedAt,
	})
	// While the descriptors travel, plan the destination side of the reads
	// and, when the holder's member advertised the data address the params
	// name in earlier descriptors, connect to it: neither depends on the
	// answer, and together they are most of a pull's fixed cost.
	var early *earlyEndpoint
	var planErr error
	if m.Phase() == pullAsking {
		early = connectEarly(ctx, a.deps.Backend, &a.deps.addrs, prm.RemoteCtrl, connectBudget(a.p.Stall))
		// A holder of this region's shape (what the params say of it) is
		// read whole blocks at a time: plan that now. Any other shape waits
		// for the holder's layout in the descriptors.
		if dl := a.p.Dst.Region.Layout; (prm.TpSize == 0 || prm.TpSize == dl.TPSize) && (prm.BlockSize == 0 || prm.BlockSize == dl.BlockSize) {
			if a.p.Skip < len(prm.RemoteBlockIds) {
				plan, planErr = planDst(a.p.Dst, picked(prm.RemoteBlockIds, a.p.Skip, a.p.Pick), a.p.DstBlocks, a.p.Pick)
			}
		}
	}
	var answers <-chan *nats.Msg
	if a.asks != nil {
		answers = a.asks.C()
	}
	var (
		timer, timerC = clk.NewTimer(time.Hour)
		ctxDone       = ctx.Done()
		reads         = make(chan readResult, 1)
		renewed       = make(chan struct{}, 1)
		endAcks       = make(chan error, 1)
		n             uint64
		endOK         bool
		endLater      bool
		reading       bool      // the reads started (they own early then)
		t0            time.Time // the awaited PullEnd's start
	)
	defer timer.Stop()
	req := a.req
	end := func(ok bool) error {
		err := endRead(peer, req, ok, a.p.Stall)
		if err != nil && ok && api.CodeOf(err) != api.CodeRegionBroken {
			a.deps.Log.Warn("pull end not acknowledged by holder", "pull", a.p.ID, "member", peer.Member, "err", err)
		}
		return err
	}
	for {
		for len(fx) > 0 {
			f := fx[0]
			fx = fx[1:]
			switch f.kind {
			case doAsk:
				if err := a.asks.Post(req); err != nil {
					// Not sent (the NATS connection closed): the pull
					// fails with that, as with the holder's error.
					fx = append(fx, m.Step(pullAnswer{Now: clk.Now(), Err: err})...)
				}
			case doAskOwn:
				// The reservation's read ends (if the holder registered
				// it), and its late answers are dropped with its asks: the
				// pull reads only under a read of its own now.
				rsv := req
				a.deps.goBackground(func() { _ = endRead(peer, rsv, false, a.p.Stall) })
				a.asks.Close()
				req = descriptorsRequest(a.p)
				asks, err := postDescriptors(a.deps, a.p, req)
				if err != nil {
					answers = nil
					fx = append(fx, m.Step(pullAnswer{Now: clk.Now(), Err: err})...)
					break
				}
				a.asks, answers = asks, asks.C()
			case doRead:
				reading = true
				a.descDur = clk.Now().Sub(a.start)
				bindHolder(f.desc.HolderIncarnation)
				desc := f.desc
				go func() {
					n, err := a.readAll(ctx, desc, &plan, planErr, early, peer)
					reads <- readResult{n, err}
				}()
			case doRenew:
				go func() {
					every := m.renewEvery
					rctx, cancel := context.WithTimeout(ctx, every)
					_, err := peer.Renew(rctx, &messages.HoldRef{TransferId: prm.TransferId, Requester: requester})
					cancel()
					if err != nil && ctx.Err() == nil {
						a.deps.Log.Warn("lease renew during pull failed", "pull", a.p.ID, "err", err)
					}
					renewed <- struct{}{}
				}()
			case doEndAwait:
				t0 = clk.Now()
				go func() { endAcks <- end(true) }()
			case doEndNow:
				// Nobody waits for it: a frozen holder must not delay
				// the notice.
				a.deps.goBackground(func() { _ = end(false) })
			case doDone:
				if !reading {
					a.descDur = clk.Now().Sub(a.start) // what asking took
					early.drop()                       // no descriptors: nothing to connect to
				}
				giveBack()
				a.finish(n, f.err)
			case doEndLater:
				// After the PullDone notice: the engine waits for that,
				// nobody for this.
				endOK, endLater = f.ok, true
			}
		}
		if answers != nil && m.Phase() != pullAsking {
			// The first answer won: later ones are dropped unread.
			a.asks.Close()
			answers = nil
		}
		if m.Phase() == pullDone {
			if endLater {
				_ = end(endOK)
			}
			return
		}
		if w := m.Wake(); !w.IsZero() {
			timer.Reset(max(w.Sub(clk.Now()), 0))
		} else {
			timer.Stop()
		}
		answer := func(msg *nats.Msg) []pullEffect {
			d := new(messages.Descriptors)
			err := a.asks.Decode(msg, d)
			if err != nil {
				d = nil
			}
			return m.Step(pullAnswer{Now: clk.Now(), Desc: d, Err: err, NoResponders: errors.Is(err, nats.ErrNoResponders)})
		}
		// An answer already queued (a reservation's) goes before a
		// re-ask its timer may be due for.
		select {
		case msg := <-answers:
			fx = answer(msg)
			continue
		default:
		}
		select {
		case <-timerC:
			fx = m.Step(pullTick{Now: clk.Now()})
		case msg := <-answers:
			fx = answer(msg)
		case r := <-reads:
			n = r.n
			fx = m.Step(pullReadDone{Now: clk.Now(), Err: r.err})
		case <-renewed:
			fx = m.Step(pullRenewed{Now: clk.Now()})
		case err := <-endAcks:
			a.endDur = clk.Now().Sub(t0)
			fx = m.Step(pullEndAck{Now: clk.Now(), Err: err})
		case <-ctxDone:
			ctxDone = nil // once: the reads end with it, by themselves
			fx = m.Step(pullEnded{Now: clk.Now(), Err: ctx.Err(), Gone: holderLeft(ctx)})
		}
	}
}

// endRead ends the read req registered at the holder (peer.pullend), ok
// when its reads succeeded, waiting at most wait for the answer.
func endRead(peer *api.Client, req *messages.DescriptorsRequest, ok bool, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err := peer.PullEnd(ctx, &messages.PullEnd{TransferId: req.TransferId, Requester: req.Requester, PullId: req.PullId, Ok: ok})
	return err
}

// readAll reads the pull once its descriptors are in hand (desc) and
// checks the destination afterwards.
func (a *puller) readAll(ctx context.Context, desc *messages.Descriptors, plan **readPlan, planErr error, early *earlyEndpoint, peer *api.Client) (uint64, error) {
	if planErr != nil {
		early.drop()
		return 0, fmt.Errorf("pull %s: %w", a.p.ID, planErr)
	}
	t0 := a.deps.clock().Now()
	n, err := a.read(ctx, desc, plan, early, peer)
	a.readDur = a.deps.clock().Now().Sub(t0)
	if err != nil {
		return 0, err
	}
	// The destination's file shrank under the copy (the data plane
	// survived it, see transport.FaultGuard): the bytes are lost.
	if err := a.p.Dst.CheckBroken(); err != nil {
		return 0, fmt.Errorf("pull %s: the destination region broke during the read: %w", a.p.ID, err)
	}
	return n, nil
}

// read plans the reads from the holder's descriptors, connects (or takes
// the early connect) and reads every byte.
func (a *puller) read(ctx context.Context, desc *messages.Descriptors, plan **readPlan, early *earlyEndpoint, peer *api.Client) (uint64, error) {
	run, total, err := a.planReads(desc, plan)
	if err != nil {
		early.drop()
		return 0, fmt.Errorf("pull %s: %w", a.p.ID, err)
	}
	if got, want := desc.GetRemoteCtrl().GetBackend(), a.deps.Backend.Name(); got != want {
		early.drop()
		return 0, api.Errorf(api.CodeIncompatible, "pull %s: holder uses data plane %q, this member %q", a.p.ID, got, want)
	}
	addr := desc.GetRemoteCtrl().GetDataAddr()
	a.deps.addrs.learn(peer.Member, addr)
	// The early connect, if it went to this address, is the connect: its
	// failure is this pull's (a second try would double the time a
	// black-holed data plane takes to fail the pull).
	ep, err, tried := early.take(addr)
	if !tried {
		cctx, ccancel := context.WithTimeout(ctx, connectBudget(a.p.Stall))
		ep, err = a.deps.Backend.Connect(cctx, addr)
		ccancel()
	}
	if err != nil {
		return 0, fmt.Errorf("pull %s: connect data plane of %s: %w", a.p.ID, peer.Member, readErr(ctx, err))
	}
	defer ep.Close()
	if err := run(a.batchReader(ctx, ep, total, peer.Member)); err != nil {
		return 0, err
	}
	return total, nil
}

// batchReader is how the pull reads total bytes through ep from the holder
// member under ctx: GetOps and strided ops in batches (readBatches), and
// views of the holder's memory where the backend's endpoints show it
// (Caps.Views: viewReader).
func (a *puller) batchReader(ctx context.Context, ep transport.Endpoint, total uint64, member string) batchReader {
	caps := a.deps.Backend.Caps()
	r := batchReader{
		get: func(ops []transport.GetOp) error {
			return a.readBatches(ctx, ep, caps, splitOps(ops, maxOpBytes(caps)), total, member)
		},
		strided: func(ops []transport.StridedOp) error {
			if !caps.Strided { // planned only with Caps.Strided; read the pieces
				return a.readBatches(ctx, ep, caps, splitOps(transport.Pieces(ops), maxOpBytes(caps)), total, member)
			}
			return a.readStridedBatches(ctx, ep, caps, ops, total, member)
		},
	}
	if caps.Views {
		v, err := transport.ViewerOf(a.deps.Backend, ep)
		if err != nil {
			// A backend that lies about its endpoints: say so (the pull
			// fails) rather than quietly read through scratch.
			r.view = func([]transport.ViewRange, func(context.Context, [][]byte) error) (bool, error) {
				return true, fmt.Errorf("pull %s: %w", a.p.ID, err)
			}
		} else {
			r.view = a.viewReader(ctx, v, total, member)
		}
	}
	return r
}

// batchReader reads a planned pull's reads: GetOps, strided ops (head
// ranges of token-major blocks) where the data plane reads those, and
// views of the holder's memory (view, nil where the data plane has none:
// see viewReader) for a pull that transforms what it reads.
type batchReader struct {
	get     func([]transport.GetOp) error
	strided func([]transport.StridedOp) error
	view    viewFunc
}

// planReads checks the holder's descriptors against the pull and plans its
// reads (planPull).
func (a *puller) planReads(desc *messages.Descriptors, plan **readPlan) (run func(batchReader) error, total uint64, err error) {
	prm := a.p.Params
	return planPull(desc, prm.RemoteBlockIds, a.p.Skip, a.p.Pick, prm.RemoteNumTokens, a.p.Dst, a.p.DstBlocks, plan, a.deps.translations.get, a.deps.Backend.Caps().Strided)
}

// readErr is the error a pull step ends with: the holder's departure when
// that cancelled ctx, else err with context errors mapped to the transport's
// sentinels.
func readErr(ctx context.Context, err error) error { return stepErr(holderLeft(ctx), err) }

// stepErr is the error a pull step ends with: gone (the holder's
// departure, a *HolderLeftError) when that ended it, else err with context
// errors mapped to the transport's sentinels. A pull canceled while its
// descriptors travel is a canceled transfer (transfer_failed: connexd
// shutting down), or peer_unavailable when its holder left the cluster,
// like one canceled during its reads, not an internal error: the NATS
// client reports the cancellation as a bare context.Canceled.
func stepErr(gone, err error) error {
	switch {
	case gone == nil:
		return transport.CtxErr(err)
	case err == nil, errors.Is(err, context.Canceled), errors.Is(err, transport.ErrCanceled), errors.Is(err, transport.ErrClosed):
		return gone // the cancellation itself: nothing more to say
	default:
		// A failure of its own that raced the departure: keep its text.
		return fmt.Errorf("%w (%v)", gone, err)
	}
}
