package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/clock"
	waitpoll "github.com/connex/connex/harness/poll"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/regionfile"
	"github.com/connex/connex/lease"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
)

// fakeBackend is a transport.Backend whose registrations are counted and
// whose Register can be made to panic, to exercise supervision.
type fakeBackend struct {
	live      atomic.Int64
	panicNext atomic.Bool
	// deregFails: Deregister reports that the memory stays registered.
	deregFails atomic.Bool
	// deregPanics: the next Deregister panics.
	deregPanics atomic.Bool
}

type fakeReg struct {
	b    *fakeBackend
	n    int
	once sync.Once
}

func (r *fakeReg) RemoteKey() []byte  { return []byte{1} }
func (r *fakeReg) RemoteAddr() uint64 { return 0 }
func (r *fakeReg) Len() int           { return r.n }
func (r *fakeReg) Deregister() error {
	if r.b.deregPanics.Swap(false) {
		panic("injected failure while revoking a registration")
	}
	if r.b.deregFails.Load() {
		return errors.New("injected: memory left registered")
	}
	r.once.Do(func() { r.b.live.Add(-1) })
	return nil
}

func (b *fakeBackend) Name() string         { return "fake" }
func (b *fakeBackend) Caps() transport.Caps { return transport.Caps{} }
func (b *fakeBackend) Address() []byte      { return []byte("fake") }
func (b *fakeBackend) Close() error         { return nil }
func (b *fakeBackend) Register(mem []byte) (transport.Registration, error) {
	if b.panicNext.Swap(false) {
		panic("injected register failure")
	}
	b.live.Add(1)
	return &fakeReg{b: b, n: len(mem)}, nil
}
func (b *fakeBackend) Connect(context.Context, []byte) (transport.Endpoint, error) {
	return nil, transport.ErrUnavailable
}

type holdRig struct {
	t       *testing.T
	sys     *actor.ActorSystem
	table   *actor.PID
	be      *fakeBackend
	region  *kvmem.Mapped
	mu      sync.Mutex
	notices []*messages.BlocksFreed
	regRefs atomic.Int64
	dir     *HoldTable
	metrics *Metrics
	deps    *HoldDeps
	// panicNext makes the hold actor's next call of Incarnation (while it
	// answers a StartRead) panic, to exercise the Stopping path of a live
	// hold.
	panicNext atomic.Bool
	// panicNotify makes the next blocks.freed notice panic before it is
	// recorded (the free cut short midway).
	panicNotify atomic.Bool
}

func newHoldRig(t *testing.T) *holdRig { return newHoldRigClock(t, nil) }

// newHoldRigClock is newHoldRig with the hold actors and the directory on
// clk (nil: the system clock).
func newHoldRigClock(t *testing.T, clk clock.Clock) *holdRig {
	l := kvmem.Layout{Layers: 2, Planes: 2, Blocks: 8, BlockBytes: 64, BlockSize: 4, TPSize: 1}
	rig := &holdRig{t: t, be: &fakeBackend{}, region: mapped(t, l), metrics: &Metrics{}}
	rig.sys = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	t.Cleanup(rig.sys.Shutdown)
	rig.dir = NewHoldTable(time.Minute, clk)
	deps := &HoldDeps{
		Backend: rig.be, Ctrl: &messages.RemoteCtrl{Member: "m"}, Dir: rig.dir, Clock: clk,
		Log: slog.New(slog.DiscardHandler), Metrics: rig.metrics, ReadSlack: time.Second,
		Notify: func(m *messages.BlocksFreed) {
			if rig.panicNotify.Swap(false) {
				panic("injected failure while telling the engine")
			}
			rig.mu.Lock()
			rig.notices = append(rig.notices, m)
			rig.mu.Unlock()
		},
		Incarnation: func() string {
			if rig.panicNext.Swap(false) {
				panic("injected failure while answering a pull")
			}
			return "inc"
		},
	}
	rig.deps = deps
	rig.table = rig.sys.Root.Spawn(HoldSupervisorProps(deps))
	return rig
}

func (r *holdRig) create(blocks []uint32) (Reply, error) {
	return r.createMode(blocks, lease.OnFinish)
}

func (r *holdRig) createMode(blocks []uint32, mode lease.Mode) (Reply, error) {
	r.regRefs.Add(1)
	res, err := r.sys.Root.RequestFuture(r.table, &CreateHold{
		ID: NewTransferID(), Req: &messages.CreateHoldRequest{EngineId: "e", RegionId: "r", BlockIds: blocks},
		Region: r.region, ReleaseRegion: func() { r.regRefs.Add(-1) },
		Lease: lease.Config{Retain: time.Minute, Mode: mode},
	}, 500*time.Millisecond).Result()
	if err != nil {
		return Reply{}, err
	}
	rep := res.(Reply)
	return rep, rep.Err
}

// mapped is a fresh region file of layout l, as a hold's region.
func mapped(t *testing.T, l kvmem.Layout) *kvmem.Mapped {
	t.Helper()
	r, err := regionfile.Create(filepath.Join(t.TempDir(), "r"), l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return &kvmem.Mapped{Engine: "e", ID: "r", Region: r, Blocks: kvmem.NewBlockTable(l.Blocks)}
}

// poll waits up to 5 s for fn to hold (package poll), naming what it
// waits for.
func poll(t *testing.T, what string, fn func() error) {
	t.Helper()
	waitpoll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		if err := fn(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	})
}

// TestHoldActorReleaseFreesOnce checks the normal path through the actor:
// registrations per extent, one notice, accounting back to free, region
// reference returned.
func TestHoldActorReleaseFreesOnce(t *testing.T) {
	rig := newHoldRig(t)
	rep, err := rig.create([]uint32{1, 2, 5})
	if err != nil {
		t.Fatal(err)
	}
	if n := rig.be.live.Load(); n != 2*2*2 { // 2 layers × 2 planes × 2 runs
		t.Fatalf("%d registrations", n)
	}
	id := rep.Create.Params.TransferId
	e, _, _ := rig.dir.Lookup(id)
	if e == nil {
		t.Fatal("hold not in the directory")
	}
	res, err := rig.sys.Root.RequestFuture(e.PID, &ReleaseHold{By: "e"}, time.Second).Result()
	if err != nil || res.(Reply).Err != nil {
		t.Fatalf("release: %v %v", err, res)
	}
	// A second release finds a tombstone, not a second free.
	if _, st, ended := rig.dir.Lookup(id); !ended || st != lease.Released {
		t.Fatalf("directory after release: ended=%v state=%s", ended, st)
	}
	poll(t, "freed", func() error {
		rig.mu.Lock()
		defer rig.mu.Unlock()
		if len(rig.notices) != 1 || rig.be.live.Load() != 0 || rig.region.Blocks.Counts().Held != 0 || rig.regRefs.Load() != 0 {
			return fmt.Errorf("notices %d, registrations %d, held %d, region refs %d", len(rig.notices), rig.be.live.Load(), rig.region.Blocks.Counts().Held, rig.regRefs.Load())
		}
		return nil
	})
}

// TestHoldWhoseDeregisterFailsKeepsItsBlocks: when the data plane cannot
// revoke a hold's registrations (a reader may still read them), the hold
// ends but its blocks never go back to the engine (no blocks.freed, still
// held in the accounting), and the metric says so.
func TestHoldWhoseDeregisterFailsKeepsItsBlocks(t *testing.T) {
	rig := newHoldRig(t)
	rep, err := rig.create([]uint32{1, 2, 5})
	if err != nil {
		t.Fatal(err)
	}
	rig.be.deregFails.Store(true)
	id := rep.Create.Params.TransferId
	e, _, _ := rig.dir.Lookup(id)
	res, err := rig.sys.Root.RequestFuture(e.PID, &ReleaseHold{By: "e"}, time.Second).Result()
	if err != nil || res.(Reply).Err != nil {
		t.Fatalf("release: %v %v", err, res)
	}
	// While it lingers its status never reads freed (engine.state: an
	// engine rebuilding its holds would take the blocks back).
	if rep, err := rig.sys.Root.RequestFuture(e.PID, &InspectHold{}, time.Second).Result(); err != nil {
		t.Fatal(err)
	} else if st := rep.(Reply).Status; st.GetFreed() || st.GetState() != "quarantined" {
		t.Fatalf("a quarantined hold's status: state %q freed %v, want quarantined and not freed", st.GetState(), st.GetFreed())
	}
	if n := rig.dir.CountEngine("e"); n != 0 {
		t.Fatalf("a quarantined hold counts against its engine's holds: %d", n)
	}
	poll(t, "ended and stopped", func() error {
		if rig.metrics.HoldsQuarantined.Load() != 1 {
			return fmt.Errorf("quarantined %d", rig.metrics.HoldsQuarantined.Load())
		}
		if _, err := rig.sys.Root.RequestFuture(e.PID, &InspectHold{}, 100*time.Millisecond).Result(); !errors.Is(err, actor.ErrDeadLetter) {
			return fmt.Errorf("the hold actor still answers (%v)", err)
		}
		return nil
	})
	// Its region stays mapped: a reader may still see the registration,
	// so the memory must not be unmapped or come back as another engine's.
	if refs := rig.regRefs.Load(); refs != 1 {
		t.Fatalf("a quarantined hold left %d region references, want its 1 kept for good", refs)
	}
	// Its directory entry stays, marked: engine.state lists it, so an
	// engine rebuilding its holds from it never takes the blocks back.
	if e, _, _ := rig.dir.Lookup(id); e == nil || !e.Quarantined.Load() {
		t.Fatalf("the quarantined hold's directory entry: %v, want it kept and marked", e)
	}
	rig.mu.Lock()
	defer rig.mu.Unlock()
	if len(rig.notices) != 0 {
		t.Fatalf("the engine was told %v: it would reuse blocks a reader may still see", rig.notices)
	}
	if held := rig.region.Blocks.Counts().Held; held != 3 {
		t.Fatalf("%d blocks held after a failed deregister, want the hold's 3 kept for good", held)
	}
}

// TestPanicWhileFreeingStillFrees: a hold actor that panics while it
// carries out its lease's Free (here: telling the engine) is stopped by
// its supervisor, and its Stopping handler finishes the free — the lease,
// terminal already, emits nothing more: the blocks go back exactly once,
// the engine is told, the directory keeps a tombstone and the region
// reference goes back.
func TestPanicWhileFreeingStillFrees(t *testing.T) {
	rig := newHoldRig(t)
	rep, err := rig.create([]uint32{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	id := rep.Create.Params.TransferId
	e, _, _ := rig.dir.Lookup(id)
	rig.panicNotify.Store(true)
	_, _ = rig.sys.Root.RequestFuture(e.PID, &ReleaseHold{By: "e"}, 500*time.Millisecond).Result() // no answer: it panicked
	poll(t, "the free finished by Stopping", func() error {
		_, _, ended := rig.dir.Lookup(id)
		rig.mu.Lock()
		n := len(rig.notices)
		rig.mu.Unlock()
		if held := rig.region.Blocks.Counts().Held; held != 0 || !ended || n != 1 || rig.regRefs.Load() != 0 {
			return fmt.Errorf("held %d, tombstone %v, notices %d, region refs %d", held, ended, n, rig.regRefs.Load())
		}
		return nil
	})
	if d := rig.metrics.DoubleFrees.Load(); d != 0 {
		t.Fatalf("%d double frees", d)
	}
}

// TestPanicWhileDeregisteringQuarantines: a hold actor that panics while
// it revokes its registrations cannot prove a reader lost them: its Stopping
// handler quarantines the hold (blocks held for good, no notice, the region
// kept mapped, its directory entry kept and marked quarantined, so that
// engine.state still lists it).
func TestPanicWhileDeregisteringQuarantines(t *testing.T) {
	rig := newHoldRig(t)
	rep, err := rig.create([]uint32{3, 4})
	if err != nil {
		t.Fatal(err)
	}
	id := rep.Create.Params.TransferId
	e, _, _ := rig.dir.Lookup(id)
	rig.be.deregPanics.Store(true)
	_, _ = rig.sys.Root.RequestFuture(e.PID, &ReleaseHold{By: "e"}, 500*time.Millisecond).Result() // no answer: it panicked
	poll(t, "quarantined", func() error {
		if e, _, _ := rig.dir.Lookup(id); e == nil || !e.Quarantined.Load() || rig.metrics.HoldsQuarantined.Load() != 1 {
			return fmt.Errorf("entry %v, quarantined %d", e, rig.metrics.HoldsQuarantined.Load())
		}
		return nil
	})
	rig.mu.Lock()
	n := len(rig.notices)
	rig.mu.Unlock()
	if held := rig.region.Blocks.Counts().Held; held != 2 || n != 0 || rig.regRefs.Load() != 1 {
		t.Fatalf("held %d (want 2), notices %d (want 0), region refs %d (want 1)", held, n, rig.regRefs.Load())
	}
}

// TestHoldActorPanicGivesEverythingBack makes a hold actor panic while it
// registers its memory: the supervisor stops it (never restarts it), and
// its Stopping handler undoes the accounting and registrations.
func TestHoldActorPanicGivesEverythingBack(t *testing.T) {
	rig := newHoldRig(t)
	rig.be.panicNext.Store(true)
	if _, err := rig.create([]uint32{0, 1}); err == nil {
		t.Fatal("create must fail when the actor panics")
	} else if !errors.Is(err, actor.ErrTimeout) && !errors.Is(err, actor.ErrDeadLetter) {
		t.Logf("create failed with %v", err)
	}
	poll(t, "cleanup after panic", func() error {
		if rig.region.Blocks.Counts().Held != 0 || rig.be.live.Load() != 0 || rig.regRefs.Load() != 0 {
			return fmt.Errorf("held %d, registrations %d, region refs %d", rig.region.Blocks.Counts().Held, rig.be.live.Load(), rig.regRefs.Load())
		}
		return nil
	})
	rig.mu.Lock()
	n := len(rig.notices)
	rig.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d freed notices for a hold the engine never learned of", n)
	}
	// The table survives its child's failure and keeps serving.
	if _, err := rig.create([]uint32{0, 1}); err != nil {
		t.Fatalf("create after a child's panic: %v", err)
	}
}

// TestDescriptorsSayWhetherPullEndMayBeAsync: an on_finish hold lets the
// puller publish PullDone without waiting for its PullEnd to be
// acknowledged; an after_pull hold does not (its PullDone promises that the
// hold counted the pull and freed the blocks).
func TestDescriptorsSayWhetherPullEndMayBeAsync(t *testing.T) {
	rig := newHoldRig(t)
	for _, c := range []struct {
		mode  lease.Mode
		async bool
	}{{lease.OnFinish, true}, {lease.AfterPull, false}} {
		rep, err := rig.createMode([]uint32{1, 2}, c.mode)
		if err != nil {
			t.Fatal(err)
		}
		e, _, _ := rig.dir.Lookup(rep.Create.Params.TransferId)
		res, err := rig.sys.Root.RequestFuture(e.PID, &StartRead{By: "d", PullID: "p-" + c.mode.String(), Timeout: time.Second, Layout: rig.region.Region.Layout}, time.Second).Result()
		if err != nil || res.(Reply).Err != nil {
			t.Fatalf("%s: start read: %v %v", c.mode, err, res)
		}
		if got := res.(Reply).Desc.GetPullEndAsync(); got != c.async {
			t.Fatalf("%s hold: descriptors pull_end_async=%v, want %v", c.mode, got, c.async)
		}
	}
}

// TestHoldOfARegionDroppedMeanwhileEndsItself: engine.gone dropped the
// region after a hold.create acquired it but before the hold was listed
// (engine.gone's sweep of the engine's holds would miss it): the create is
// refused as engine_gone and the hold frees its blocks and registrations
// at once (no notice: its engine is gone), not at claim_s or retain_s.
func TestHoldOfARegionDroppedMeanwhileEndsItself(t *testing.T) {
	rig := newHoldRig(t)
	table := kvmem.NewRegionTable(nil)
	m, err := table.Add("e", "r", rig.region.Region)
	if err != nil {
		t.Fatal(err)
	}
	region, release, err := table.Acquire("e", "r")
	if err != nil {
		t.Fatal(err)
	}
	if n := table.DropEngine("e"); n != 1 || !m.Gone() {
		t.Fatalf("DropEngine dropped %d regions, gone=%v", n, m.Gone())
	}
	res, err := rig.sys.Root.RequestFuture(rig.table, &CreateHold{
		ID: NewTransferID(), Req: &messages.CreateHoldRequest{EngineId: "e", RegionId: "r", BlockIds: []uint32{1, 2}},
		Region: region, ReleaseRegion: release,
		Lease: lease.Config{Retain: time.Minute, Mode: lease.OnFinish},
	}, 2*time.Second).Result()
	if err != nil {
		t.Fatal(err)
	}
	if rep := res.(Reply); !errors.Is(rep.Err, lease.ErrEngineGone) {
		t.Fatalf("create on a dropped region: %+v, want ErrEngineGone", rep)
	}
	poll(t, "the hold ended", func() error {
		rig.mu.Lock()
		defer rig.mu.Unlock()
		if rig.be.live.Load() != 0 || region.Blocks.Counts().Held != 0 || len(rig.dir.ByEngine("e")) != 0 {
			return fmt.Errorf("registrations %d, held %d, listed %d", rig.be.live.Load(), region.Blocks.Counts().Held, len(rig.dir.ByEngine("e")))
		}
		return nil
	})
}
