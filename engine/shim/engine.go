package shim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// DefaultProgressInterval is Config.ProgressInterval's default: the least
// time between two request.progress calls of one request.
const DefaultProgressInterval = 200 * time.Millisecond

// Roles an engine registers with.
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Config says which engine this is, where its connexd is, and its KV
// geometry.
type Config struct {
	NC       *nats.Conn // connection to the NATS server of the engine's connexd
	Member   string     // member_id of the engine's local connexd
	EngineID string     // this engine's id (one subject token), unique in the cluster
	RegionID string     // KV region id; "" means "r0"
	Role     string     // RolePrefill or RoleDecode
	Model    string     // served model name
	BaseURL  string     // root of the engine's OpenAI HTTP API, e.g. http://127.0.0.1:8100
	// Layout is the KV geometry of the region connexd creates: rank 0's
	// (TPRank 0) for an engine with TPSize > 1, which gets one region per
	// rank (RankRegionID), each alike but for its TPRank.
	Layout kvmem.Layout

	MaxModelLen uint32 // advertised in the registration (0: unknown)

	// RegisterTTL is the registration's TTL; 0 uses the member's default
	// (3 s). It is renewed every renew_ms the member answers (a third).
	RegisterTTL time.Duration
	// CallTimeout bounds one API call; 0 means 5 s.
	CallTimeout time.Duration
	// PullTimeout is the deadline of one pull; 0 uses 30 s.
	PullTimeout time.Duration
	// ProgressEvery and ProgressDelay batch request.progress: a call goes
	// out once ProgressEvery tokens wait or the oldest is ProgressDelay
	// old (defaults 8 and 100 ms), never two at a time, and never sooner
	// than ProgressInterval after the request's previous call (default
	// 200 ms; negative: no floor), so that each request's checkpoints —
	// durable writes of its record — come at a bounded rate however fast
	// the engine generates. A resume decided by the cluster (not by a
	// router, which resends what it relayed) recomputes from the last
	// checkpoint.
	ProgressEvery    int
	ProgressDelay    time.Duration
	ProgressInterval time.Duration
	// DefaultLoadFailurePolicy applies when a load fails before any
	// pull.done told the connexd's policy (a pull.start error): "fail"
	// (default) or "recompute".
	DefaultLoadFailurePolicy string

	// Log receives the shim's lines, each with engine=EngineID added here:
	// give it a logger that does not name the engine already. Nil discards.
	Log *slog.Logger
}

func (c *Config) defaults() error {
	if c.NC == nil {
		return errors.New("shim: config: NC (NATS connection) is nil")
	}
	if !api.ValidToken(c.Member) {
		return fmt.Errorf("shim: config: member %q is not one subject token", c.Member)
	}
	if !api.ValidToken(c.EngineID) {
		return fmt.Errorf("shim: config: engine id %q is not one subject token", c.EngineID)
	}
	if c.Role != RolePrefill && c.Role != RoleDecode {
		return fmt.Errorf("shim: config: role %q, allowed: %s, %s", c.Role, RolePrefill, RoleDecode)
	}
	if err := c.Layout.Validate(); err != nil {
		return fmt.Errorf("shim: config: %w", err)
	}
	if c.Layout.TPRank != 0 {
		return fmt.Errorf("shim: config: layout of tp_rank %d: give rank 0's, the engine makes one region per rank", c.Layout.TPRank)
	}
	if c.RegionID == "" {
		c.RegionID = "r0"
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 5 * time.Second
	}
	if c.PullTimeout <= 0 {
		c.PullTimeout = 30 * time.Second
	}
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = 8
	}
	if c.ProgressDelay <= 0 {
		c.ProgressDelay = 100 * time.Millisecond
	}
	switch {
	case c.ProgressInterval == 0:
		c.ProgressInterval = DefaultProgressInterval
	case c.ProgressInterval < 0:
		c.ProgressInterval = 0
	}
	switch c.DefaultLoadFailurePolicy {
	case "":
		c.DefaultLoadFailurePolicy = PolicyFail
	case PolicyFail, PolicyRecompute:
	default:
		return fmt.Errorf("shim: config: load failure policy %q, allowed: %s, %s", c.DefaultLoadFailurePolicy, PolicyFail, PolicyRecompute)
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Engine is one engine's side of the subject API: its KV region, block
// allocator, registration, and notices. Its methods are safe for
// concurrent use.
type Engine struct {
	cfg Config
	cli *api.Client
	log *slog.Logger
	// instance is fresh per Open: a restarted engine registers a new one,
	// which tells its connexd that the previous instance's requests ended.
	instance string

	mu    sync.Mutex
	alloc *Allocator
	// gapOwed: notices were lost for good and engine.state could not be
	// read since (cursor.mu guards it, as the catch-up that sets it).
	gapOwed    bool
	avail      chan struct{} // closed (and replaced) whenever blocks come back
	inFlight   int
	pulls      map[string]chan *messages.PullDone
	requests   map[string]*Request
	lastPolicy string
	closed     bool
	// regions are the engine's KV regions, by TP rank.
	regions []*kvmem.Region
	// recovering: new regions are being created (regionLost); retired:
	// regions of a connexd that lost them, kept mapped for requests still
	// using them until Close.
	recovering bool
	// recoveries counts the region re-creations begun: a hold whose
	// hold.create spanned one is not recorded (Hold).
	recoveries uint64
	retired    []*kvmem.Region
	// journal is the notice journal of the last engine.register reply: a
	// new one means a new connexd, which lost the engine's region.
	journal string

	// cursor is the engine's position in its connexd's notice journal;
	// registered is set by the first engine.register.
	cursor     lockedCursor
	registered atomic.Bool

	subs []*nats.Subscription
	stop chan struct{}
	wg   sync.WaitGroup
}

// Open creates the engine's KV region on its connexd (region.create,
// retried while the member is not reachable yet, until ctx ends), maps it,
// subscribes to the engine's notices and registers the engine; a goroutine
// renews the registration until Close.
func Open(ctx context.Context, cfg Config) (*Engine, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg: cfg, cli: &api.Client{NC: cfg.NC, Member: cfg.Member, Engine: cfg.EngineID}, log: cfg.Log.With("engine", cfg.EngineID),
		alloc: NewAllocator(cfg.Layout.Blocks), avail: make(chan struct{}),
		pulls: map[string]chan *messages.PullDone{}, requests: map[string]*Request{},
		stop: make(chan struct{}), instance: newInstanceID(),
	}
	rs, err := e.createRegions(ctx)
	if err != nil {
		e.gone()
		return nil, err
	}
	e.regions = rs
	// One subscription for every notice: they arrive in the order connexd
	// numbered them, on one goroutine.
	sub, err := cfg.NC.Subscribe(api.EngineNotices(cfg.Member, cfg.EngineID), e.onNotice)
	if err != nil {
		e.closeOpen()
		return nil, fmt.Errorf("shim: subscribe %s: %w", api.EngineNotices(cfg.Member, cfg.EngineID), err)
	}
	e.subs = append(e.subs, sub)
	if err := cfg.NC.FlushWithContext(ctx); err != nil {
		e.closeOpen()
		return nil, fmt.Errorf("shim: flush subscriptions of engine %s: %w", cfg.EngineID, err)
	}
	renew, err := e.register(ctx)
	if err != nil {
		e.closeOpen()
		return nil, err
	}
	e.wg.Add(1)
	go e.renewLoop(renew)
	return e, nil
}

func (e *Engine) closeOpen() {
	for _, s := range e.subs {
		_ = s.Unsubscribe()
	}
	e.gone()
	for _, r := range e.regions {
		_ = r.Close()
	}
}

func (e *Engine) gone() {
	c, cancel := context.WithTimeout(context.Background(), e.cfg.CallTimeout)
	defer cancel()
	if _, err := e.cli.EngineGone(c, &messages.EngineGoneRequest{EngineId: e.cfg.EngineID}); err != nil {
		e.log.Warn("engine.gone failed", "member", e.cfg.Member, "err", err)
	}
}

// ID is the engine id.
func (e *Engine) ID() string { return e.cfg.EngineID }

// Member is the member id of the engine's connexd.
func (e *Engine) Member() string { return e.cfg.Member }

// Region is the engine's mapped KV memory (rank 0's), valid until Close.
func (e *Engine) Region() *kvmem.Region {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.regions[0]
}

// Ranks is the engine's mapped KV memory of every TP rank, by rank, valid
// until Close; they change together when connexd lost them (regionLost).
func (e *Engine) Ranks() []*kvmem.Region {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.regions
}

// Layout is the region's geometry.
func (e *Engine) Layout() kvmem.Layout { return e.cfg.Layout }

// Info is the engine's registration with its current load figures.
func (e *Engine) Info() *messages.EngineInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	return &messages.EngineInfo{
		EngineId: e.cfg.EngineID, Role: e.cfg.Role, Model: e.cfg.Model, BaseUrl: e.cfg.BaseURL,
		InFlight: uint32(e.inFlight), BlocksFree: e.alloc.FreeCount(), BlocksTotal: e.alloc.Total(),
		BlockSize: e.cfg.Layout.BlockSize, MaxModelLen: e.cfg.MaxModelLen, InstanceId: e.instance,
	}
}

// Begin counts a request in flight (advertised as load) until the
// returned function is called.
func (e *Engine) Begin() (end func()) {
	e.mu.Lock()
	e.inFlight++
	e.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			e.inFlight--
			e.mu.Unlock()
		})
	}
}

// BlockCounts reports free and total blocks of the allocator, and how many
// transfers still hold blocks.
func (e *Engine) BlockCounts() (free, total uint32, holds int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.alloc.FreeCount(), e.alloc.Total(), e.alloc.Held()
}

// Alloc takes n blocks, waiting for blocks to come back while ctx lasts.
// A request larger than the region fails at once with ErrTooLarge.
func (e *Engine) Alloc(ctx context.Context, n int) ([]uint32, error) {
	for {
		e.mu.Lock()
		ids, err := e.alloc.Alloc(n)
		ch := e.avail
		e.mu.Unlock()
		if err == nil || !errors.Is(err, ErrNoBlocks) {
			return ids, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("engine %s: waiting for %d KV blocks: %w (%w)", e.cfg.EngineID, n, context.Cause(ctx), err)
		case <-ch:
		}
	}
}

// Free gives back blocks that no hold owns (decode blocks at the end of a
// request, or prefill blocks whose hold.create failed).
func (e *Engine) Free(ids []uint32) {
	e.mu.Lock()
	err := e.alloc.Free(ids)
	e.signalLocked()
	e.mu.Unlock()
	if err != nil {
		e.log.Error("free of KV blocks refused", "err", err)
	}
}

func (e *Engine) signalLocked() {
	close(e.avail)
	e.avail = make(chan struct{})
}

// Hold creates a hold over blocks that carry numTokens tokens of a
// prompt's KV (hold.create, no consumer binding: any decode engine may
// pull it, as a resume must) and returns its kv_transfer_params. From then
// on the blocks belong to the hold: they come back to the allocator when
// its blocks.freed notice arrives. On error the blocks stay the caller's
// (Free them).
//
// hold.create runs to its answer (CallTimeout at most) even if ctx ends
// first: connexd may create the hold after a caller gave up on it, and the
// blocks would then be free here and held there (until claim_s) under a
// transfer id nobody learned. A caller whose ctx ended meanwhile gets the
// hold and releases it (Release), which frees the blocks on both sides.
func (e *Engine) Hold(ctx context.Context, blocks []uint32, numTokens uint32) (*messages.KVTransferParams, error) {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.CallTimeout)
	defer cancel()
	req := &messages.CreateHoldRequest{EngineId: e.cfg.EngineID, RegionId: e.cfg.RegionID, BlockIds: blocks, NumTokens: numTokens}
	for r := uint32(1); r < e.cfg.Layout.TPSize; r++ {
		req.RankRegionIds = append(req.RankRegionIds, e.cfg.RankRegionID(r))
	}
	e.mu.Lock()
	recovering, recoveries := e.recovering, e.recoveries
	e.mu.Unlock()
	if recovering {
		// The KV this hold would name is in the lost region; the new one
		// has none of it.
		return nil, fmt.Errorf("engine %s: hold.create of %d blocks: %w (a new region is being created)", e.cfg.EngineID, len(blocks), ErrRegionLost)
	}
	rep, err := e.cli.CreateHold(c, req)
	// No responders: the request reached no connexd (NATS or connexd
	// reconnecting), so nothing was created and trying again is safe,
	// within the call's deadline. (A link that went down mid-call says
	// nothing of whether it was created: not tried again.)
	for wait := 50 * time.Millisecond; errors.Is(err, nats.ErrNoResponders) && c.Err() == nil; wait = min(2*wait, 500*time.Millisecond) {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-c.Done():
			t.Stop()
		}
		if c.Err() == nil {
			rep, err = e.cli.CreateHold(c, req)
		}
	}
	if err != nil {
		if e.lostRegion(err) {
			return nil, fmt.Errorf("engine %s: hold.create of %d blocks on member %s: %w (%v)", e.cfg.EngineID, len(blocks), e.cfg.Member, ErrRegionLost, err)
		}
		return nil, fmt.Errorf("engine %s: hold.create of %d blocks on member %s: %w", e.cfg.EngineID, len(blocks), e.cfg.Member, err)
	}
	e.mu.Lock()
	if e.recovering || e.recoveries != recoveries {
		// connexd restarted under this call (a recovery began, perhaps
		// ended too) and its hold may be on the new region, which has
		// none of this KV (and whose holds a recovery drops): handed
		// back, the blocks come back with its notice or the recovery.
		e.mu.Unlock()
		if rerr := e.Release(context.WithoutCancel(ctx), rep.Params.GetTransferId()); rerr != nil {
			e.log.Warn("hold made while the region was being re-created not released; it expires", "transfer", rep.Params.GetTransferId(), "err", rerr)
		}
		return nil, fmt.Errorf("engine %s: hold.create of %d blocks: %w (connexd restarted meanwhile)", e.cfg.EngineID, len(blocks), ErrRegionLost)
	}
	freed, err := e.alloc.Hold(rep.Params.GetTransferId(), blocks)
	if freed {
		e.signalLocked()
	}
	e.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("engine %s: %w", e.cfg.EngineID, err)
	}
	return rep.Params, nil
}

// Release hands back a hold this engine created (hold.release as its
// owner), for a prefill whose answer never reached its client: nobody
// else learned the transfer id, so nobody would pull or release it. The
// blocks come back with the blocks.freed notice, as for any hold.
func (e *Engine) Release(ctx context.Context, transferID string) error {
	c, cancel := context.WithTimeout(ctx, e.cfg.CallTimeout)
	defer cancel()
	if _, err := e.cli.Release(c, &messages.HoldRef{TransferId: transferID, Requester: e.cfg.EngineID}); err != nil {
		return fmt.Errorf("engine %s: hold.release of %s: %w", e.cfg.EngineID, transferID, err)
	}
	return nil
}

func (e *Engine) onFreed(n *messages.BlocksFreed) {
	e.mu.Lock()
	got, err := e.alloc.Freed(n.TransferId, n.BlockIds)
	if got > 0 {
		e.signalLocked()
	}
	e.mu.Unlock()
	if err != nil {
		e.log.Error("blocks.freed disagrees with the hold", "transfer", n.TransferId, "err", err)
	}
	e.log.Debug("blocks freed", "transfer", n.TransferId, "blocks", got, "reason", n.Reason)
}

// register sends one engine.register with fresh load figures and returns
// how long to wait before the next.
func (e *Engine) register(ctx context.Context) (time.Duration, error) {
	c, cancel := context.WithTimeout(ctx, e.cfg.CallTimeout)
	defer cancel()
	rep, err := e.cli.RegisterEngine(c, &messages.RegisterEngineRequest{Engine: e.Info(), TtlMs: uint32(e.cfg.RegisterTTL.Milliseconds())})
	if err != nil {
		return 0, fmt.Errorf("shim: engine.register of %s on member %s: %w", e.cfg.EngineID, e.cfg.Member, err)
	}
	e.mu.Lock()
	prev := e.journal
	e.journal = rep.NoticeJournal
	e.mu.Unlock()
	if prev != "" && rep.NoticeJournal != "" && prev != rep.NoticeJournal {
		e.regionLost("engine.register answered from a new connexd (notice journal " + rep.NoticeJournal + ")")
	}
	if e.registered.Swap(true) {
		e.caughtUp(rep.NoticeJournal, rep.NoticeSeq)
	} else {
		// A new instance: the notices before now were its predecessor's.
		e.seedCursor(rep.NoticeJournal, rep.NoticeSeq)
	}
	renew := time.Duration(rep.RenewMs) * time.Millisecond
	if renew <= 0 {
		renew = time.Second
	}
	return renew, nil
}

// renewLoop renews the registration every renew_ms until Close. Failures
// (connexd restarting, NATS reconnecting) are logged once per streak and
// retried at the same pace.
func (e *Engine) renewLoop(every time.Duration) {
	defer e.wg.Done()
	t := time.NewTimer(every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		next, err := e.register(context.Background())
		switch {
		case err != nil && !failing:
			e.log.Warn("engine registration renewal failed; retrying", "err", err)
			failing = true
		case err == nil && failing:
			e.log.Info("engine registration renewed again")
			failing = false
		}
		if err == nil {
			every = next
		}
		t.Reset(every)
	}
}

// Close stops the renewals, tells the connexd the engine is gone
// (engine.gone: its holds end, its region is unmapped there) and unmaps
// the region. Call it after the engine stopped serving.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.mu.Unlock()
	close(e.stop)
	e.wg.Wait()
	e.gone()
	for _, s := range e.subs {
		_ = s.Unsubscribe()
	}
	for _, r := range e.retired {
		_ = r.Close()
	}
	var errs []error
	for _, r := range e.regions {
		errs = append(errs, r.Close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("shim: close engine %s: %w", e.cfg.EngineID, err)
	}
	return nil
}

// newInstanceID is 64 random bits, hex.
func newInstanceID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
