package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/errcode"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/lease"
)

// Fakes of the concerns' narrow interfaces: no NATS, no actor system, no
// process.

var quiet = slog.New(slog.DiscardHandler)

// testLayout is a small valid region layout.
func testLayout() kvmem.Layout {
	return kvmem.Layout{Layers: 2, Planes: 2, Blocks: 8, BlockBytes: 64, BlockSize: 16, TPSize: 1}
}

// wantCode fails t unless err carries the API code want.
func wantCode(t *testing.T, what string, err error, want api.Code) {
	t.Helper()
	if got := errcode.Of(err); got != want {
		t.Fatalf("%s: code %v (err %v), want %v", what, got, err, want)
	}
}

// fakeRegions is regionBook: regions in a map, created in memory.
type fakeRegions struct {
	mu       sync.Mutex
	m        map[[2]string]*kvmem.Mapped
	admitErr error
	regErr   error
	acquired int
	released int
}

func newFakeRegions() *fakeRegions { return &fakeRegions{m: map[[2]string]*kvmem.Mapped{}} }

// put adds a region of layout l under engine/id.
func (f *fakeRegions) put(t *testing.T, engine, id string, l kvmem.Layout, memory string) *kvmem.Mapped {
	t.Helper()
	r, err := kvmem.NewRegion("/fake/"+engine+"-"+id, l, memory, make([]byte, l.Size()), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := &kvmem.Mapped{Engine: engine, ID: id, Region: r, Blocks: kvmem.NewBlockTable(l.Blocks)}
	f.mu.Lock()
	f.m[[2]string{engine, id}] = m
	f.mu.Unlock()
	return m
}

func (f *fakeRegions) Lookup(engine, id string) (*kvmem.Mapped, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m, ok := f.m[[2]string{engine, id}]; ok {
		return m, nil
	}
	return nil, fmt.Errorf("%w: engine %q region %q", kvmem.ErrUnknownRegion, engine, id)
}

func (f *fakeRegions) Acquire(engine, id string) (*kvmem.Mapped, func(), error) {
	m, err := f.Lookup(engine, id)
	if err != nil {
		return nil, nil, err
	}
	f.mu.Lock()
	f.acquired++
	f.mu.Unlock()
	return m, func() { f.mu.Lock(); f.released++; f.mu.Unlock() }, nil
}

func (f *fakeRegions) Admit(string, kvmem.Layout) error { return f.admitErr }

func (f *fakeRegions) Add(engine, id string, r *kvmem.Region) (*kvmem.Mapped, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := [2]string{engine, id}
	if _, ok := f.m[k]; ok {
		return nil, kvmem.ErrRegionExists
	}
	m := &kvmem.Mapped{Engine: engine, ID: id, Region: r, Blocks: kvmem.NewBlockTable(r.Layout.Blocks)}
	f.m[k] = m
	return m, nil
}

func (f *fakeRegions) Register(engine, id, path string, l kvmem.Layout) (*kvmem.Mapped, error) {
	if f.regErr != nil {
		return nil, f.regErr
	}
	return f.Add(engine, id, &kvmem.Region{Path: path, Layout: l, Memory: kvmem.MemoryFile})
}

func (f *fakeRegions) Engines() []string { return []string{} }

// fakeAlloc is regionMaker: memory from the Go heap, counted.
type fakeAlloc struct{ made int }

func (a *fakeAlloc) newRegion(name string, l kvmem.Layout) (*kvmem.Region, error) {
	a.made++
	return kvmem.NewRegion("/fake/"+name, l, kvmem.MemoryAllocated("fake"), make([]byte, l.Size()), nil)
}

// fakeHoldDir is holdDirectory: live holds and ended ones by id.
type fakeHoldDir struct {
	mu    sync.Mutex
	live  map[string]*actors.HoldEntry
	ended map[string]lease.State
}

func newFakeHoldDir() *fakeHoldDir {
	return &fakeHoldDir{live: map[string]*actors.HoldEntry{}, ended: map[string]lease.State{}}
}

// hold adds a live hold of engine named id; its pid names it.
func (d *fakeHoldDir) hold(id, engine string) *actors.HoldEntry {
	e := &actors.HoldEntry{PID: actor.NewPID("fake", id), Engine: engine}
	d.mu.Lock()
	d.live[id] = e
	d.mu.Unlock()
	return e
}

// end moves hold id to the ended ones in state st.
func (d *fakeHoldDir) end(id string, st lease.State) {
	d.mu.Lock()
	delete(d.live, id)
	d.ended[id] = st
	d.mu.Unlock()
}

func (d *fakeHoldDir) Lookup(id string) (*actors.HoldEntry, lease.State, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if st, ok := d.ended[id]; ok {
		return nil, st, true
	}
	return d.live[id], 0, false
}

func (d *fakeHoldDir) CountEngine(engine string) int { return len(d.ByEngine(engine)) }

func (d *fakeHoldDir) ByEngine(engine string) map[string]*actors.HoldEntry {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[string]*actors.HoldEntry{}
	for id, e := range d.live {
		if e.Engine == engine {
			out[id] = e
		}
	}
	return out
}

// sent is one message a fake actor got: to whom (pid id) and what.
type sent struct {
	to  string
	msg any
}

// fakeHoldActors is holdActors: every message is recorded, and answer
// decides each reply (nil: an empty Reply).
type fakeHoldActors struct {
	mu     sync.Mutex
	got    []sent
	answer func(to string, msg any) (actors.Reply, error)
}

func (f *fakeHoldActors) record(to string, msg any) (actors.Reply, error) {
	f.mu.Lock()
	f.got = append(f.got, sent{to, msg})
	answer := f.answer
	f.mu.Unlock()
	if answer == nil {
		return actors.Reply{}, nil
	}
	return answer(to, msg)
}

func (f *fakeHoldActors) create(msg *actors.CreateHold) (actors.Reply, error) {
	return f.record("table", msg)
}

func (f *fakeHoldActors) ask(pid *actor.PID, msg any) (actors.Reply, error) {
	return f.record(pid.Id, msg)
}

func (f *fakeHoldActors) tell(pid *actor.PID, msg any, fn func(actors.Reply, bool)) error {
	rep, err := f.record(pid.Id, msg)
	if errors.Is(err, actor.ErrDeadLetter) {
		go fn(actors.Reply{}, true)
		return nil
	}
	rep.Err = err
	go fn(rep, false)
	return nil
}

// messages is what the fake actors got, in order.
func (f *fakeHoldActors) messages() []sent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sent(nil), f.got...)
}
