package daemon

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/pull"
)

// fakePullers is pullStarter: the pulls it was given, and those it was
// told to refuse, with why.
type fakePullers struct {
	started []*pull.Pull
	refused []refusedPull
	ended   []string
}

type refusedPull struct {
	p   *pull.Pull
	err error
}

func (f *fakePullers) startPull(p *pull.Pull)  { f.started = append(f.started, p) }
func (f *fakePullers) endEngine(engine string) { f.ended = append(f.ended, engine) }

func (f *fakePullers) refusePull(p *pull.Pull, err error) {
	f.refused = append(f.refused, refusedPull{p, err})
}

func newTestPullAPI() (*pullAPI, *fakeRegions, *fakePullers) {
	regs, ps := newFakeRegions(), &fakePullers{}
	return &pullAPI{backend: "tcp", timeout: 30 * time.Second, stall: 10 * time.Second, regions: regs, pullers: ps,
		inflight: newPullTable(), clock: clock.NewFake(time.Unix(1000, 0))}, regs, ps
}

// pullOf is a pull.start of two remote blocks of 16 tokens into dst.
func pullOf(transfer, pullID string, dst ...uint32) *messages.StartPullRequest {
	return &messages.StartPullRequest{EngineId: "d1", RegionId: "r", PullId: pullID, BlockIds: dst,
		Params: &messages.KVTransferParams{TransferId: transfer, RemoteCtrl: &messages.RemoteCtrl{Member: "p1", Backend: "tcp"},
			RemoteBlockIds: []uint32{0, 1}, RemoteNumTokens: 32, TpSize: 1, BlockSize: 16}}
}

func TestStartPullRefusals(t *testing.T) {
	a, regs, ps := newTestPullAPI()
	ctx := context.Background()
	_, err := a.StartPull(ctx, &messages.StartPullRequest{EngineId: "d1"})
	wantCode(t, "pull without params", err, api.CodeBadRequest)
	_, err = a.StartPull(ctx, pullOf("abc", "p1", 2, 3))
	wantCode(t, "pull of a malformed transfer id", err, api.CodeBadRequest)
	other := pullOf(tid1, "p1", 2, 3)
	other.Params.RemoteCtrl.Backend = "ucx"
	_, err = a.StartPull(ctx, other)
	wantCode(t, "pull from a holder on another data plane", err, api.CodeIncompatible)
	_, err = a.StartPull(ctx, pullOf(tid1, "p1", 2, 3))
	wantCode(t, "pull into an unknown region", err, api.CodeUnknownRegion)
	if a.inflight.Len() != 0 {
		t.Fatal("a pull refused for its region stays in the table: its id cannot be sent again")
	}
	regs.put(t, "d1", "r", testLayout(), "test")
	_, err = a.StartPull(ctx, pullOf(tid1, "p1", 2))
	if err == nil || a.inflight.Len() != 0 || regs.acquired != regs.released {
		t.Fatalf("pull of 2 remote blocks into 1: err %v, %d running, region acquired %d released %d; want refused and all given back",
			err, a.inflight.Len(), regs.acquired, regs.released)
	}
	if len(ps.started) != 0 {
		t.Fatalf("%d pullers started for refused pulls", len(ps.started))
	}
}

func TestStartPullSentAgainStartsOnePull(t *testing.T) {
	a, regs, ps := newTestPullAPI()
	regs.put(t, "d1", "r", testLayout(), "test")
	ctx := context.Background()
	rep, err := a.StartPull(ctx, pullOf(tid1, "p1", 2, 3))
	if err != nil || rep.PullId != "p1" {
		t.Fatalf("pull.start: %v, %v", rep, err)
	}
	// Its answer was lost: the engine sends it again.
	rep, err = a.StartPull(ctx, pullOf(tid1, "p1", 2, 3))
	if err != nil || rep.PullId != "p1" {
		t.Fatalf("pull.start again: %v, %v; want the running pull's id", rep, err)
	}
	if len(ps.started) != 1 || regs.acquired != 1 {
		t.Fatalf("%d pullers started, %d regions acquired; want one pull", len(ps.started), regs.acquired)
	}
	if p := ps.started[0]; p.Stall != 10*time.Second || p.Timeout != 30*time.Second || len(p.DstBlocks) != 2 {
		t.Fatalf("pull %+v: want stall 10s, timeout 30s, 2 blocks", p)
	}
	// The same id for another transfer while it runs: refused.
	_, err = a.StartPull(ctx, pullOf(tid2, "p1", 4, 5))
	wantCode(t, "another pull under a running pull's id", err, api.CodeBadRequest)
	// A caller's short deadline bounds the stall too.
	short := pullOf(tid2, "p2", 4, 5)
	short.TimeoutMs = 2000
	if _, err := a.StartPull(ctx, short); err != nil {
		t.Fatal(err)
	}
	if p := ps.started[1]; p.Stall != 2*time.Second || p.Timeout != 2*time.Second {
		t.Fatalf("pull with timeout_ms=2000: stall %s timeout %s, want 2s each", p.Stall, p.Timeout)
	}
}

// TestEngineGoneEndsItsPulls: each engine's running pulls share a scope
// under the daemon's; engine.gone ends it (its pulls stop writing a region
// a new instance may register again), not another engine's; a scope goes
// with its last pull; the daemon's end ends them all.
func TestEngineGoneEndsItsPulls(t *testing.T) {
	base, stop := context.WithCancel(context.Background())
	defer stop()
	p := newPullDeps(&pull.PullDeps{Ctx: base})
	p.mu.Lock()
	s1, s2 := p.scopeLocked("e1"), p.scopeLocked("e2")
	s1.running, s2.running = 1, 1
	same := p.scopeLocked("e1") == s1
	p.mu.Unlock()
	if !same {
		t.Fatal("a second pull of e1 got another scope")
	}
	p.endEngine("e1")
	if s1.ctx.Err() == nil || !strings.Contains(context.Cause(s1.ctx).Error(), "engine e1 went away") {
		t.Fatalf("e1's pulls after engine.gone: %v (%v)", s1.ctx.Err(), context.Cause(s1.ctx))
	}
	if s2.ctx.Err() != nil {
		t.Fatalf("e2's pulls ended with e1's: %v", s2.ctx.Err())
	}
	p.ended("e1", s1) // the ended scope's pull gives its region back
	p.ended("e2", s2)
	if s2.ctx.Err() == nil || len(p.engines) != 0 {
		t.Fatalf("scopes after their last pulls: e2 %v, %d kept", s2.ctx.Err(), len(p.engines))
	}
	p.mu.Lock()
	again := p.scopeLocked("e1")
	p.mu.Unlock()
	if again.ctx.Err() != nil {
		t.Fatal("a new instance of e1 pulls under an ended scope")
	}
	stop()
	if again.ctx.Err() == nil {
		t.Fatal("the daemon's end did not end the engines' pulls")
	}
}

// TestPullOfAnEngineGoneMeanwhileIsRefused: a pull that acquired its
// region before engine.gone and starts after it (held for its request's
// start) is refused engine_gone, its blocks and region given back, not run
// into a region its engine left.
func TestPullOfAnEngineGoneMeanwhileIsRefused(t *testing.T) {
	table := kvmem.NewRegionTable(nil)
	l := kvmem.Layout{Layers: 1, Planes: 2, Blocks: 4, BlockBytes: 64, BlockSize: 16, TPSize: 1}
	region, err := kvmem.NewRegion("", l, "heap", make([]byte, l.Size()), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := table.Add("e1", "r0", region); err != nil {
		t.Fatal(err)
	}
	dst, release, err := table.Acquire("e1", "r0")
	if err != nil {
		t.Fatal(err)
	}
	if err := dst.Blocks.BeginWrite([]uint32{1}); err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	done := make(chan *messages.PullDone, 1)
	p := newPullDeps(&pull.PullDeps{Metrics: &actors.Metrics{}, Log: slog.New(slog.DiscardHandler), Notify: func(d *messages.PullDone) { done <- d }})
	table.DropEngine("e1")
	p.endEngine("e1")
	p.startPull(&pull.Pull{ID: "p1", Params: &messages.KVTransferParams{}, Dst: dst, DstBlocks: []uint32{1}, ReleaseRegion: func() { release(); close(released) }})
	select {
	case d := <-done:
		if d.Ok || api.Code(d.ErrorCode) != api.CodeEngineGone {
			t.Fatalf("pull.done %+v, want engine_gone", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no pull.done for the refused pull")
	}
	<-released
	if err := dst.Blocks.BeginWrite([]uint32{1}); err != nil {
		t.Fatalf("the refused pull's destination block is still being written: %v", err)
	}
	if len(p.engines) != 0 {
		t.Fatal("a refused pull left a scope behind")
	}
}
