package daemon

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
)

// fakeRequestActors is requestActors: running requests by id, and what
// each actor got. A spawned actor runs under the id its first message
// names.
type fakeRequestActors struct {
	mu     sync.Mutex
	live   map[string]*actor.PID
	got    []sent
	askErr error
	// spawnErr, if set, is a spawn's answer (its actor still runs: the
	// id was claimed by another one).
	spawnErr error
}

func newFakeRequestActors(ids ...string) *fakeRequestActors {
	f := &fakeRequestActors{live: map[string]*actor.PID{}}
	for _, id := range ids {
		f.live[id] = actor.NewPID("fake", id)
	}
	return f
}

func (f *fakeRequestActors) lookup(id string) (*actor.PID, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.live[id]
	return p, ok
}

func (f *fakeRequestActors) running() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

func (f *fakeRequestActors) all() []*actor.PID {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*actor.PID
	for _, p := range f.live {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Id < out[j].Id })
	return out
}

func (f *fakeRequestActors) ask(pid *actor.PID, msg any) (*messages.RequestStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, sent{pid.Id, msg})
	return &messages.RequestStatus{State: &messages.RequestState{RequestId: pid.Id, EngineId: "d1"}}, f.askErr
}

func (f *fakeRequestActors) spawn(first any) (*messages.RequestStatus, error) {
	var id string
	switch m := first.(type) {
	case *actors.StartRequest:
		id = m.Msg.RequestId
	case *actors.AdoptRequest:
		id = m.ID
	case *actors.GrantRequest:
		id = m.ID
	}
	f.mu.Lock()
	f.live[id] = actor.NewPID("fake", id)
	err := f.spawnErr
	f.mu.Unlock()
	st, askErr := f.ask(actor.NewPID("fake", id), first)
	if err != nil {
		return nil, err
	}
	return st, askErr
}

func (f *fakeRequestActors) send(pid *actor.PID, msg any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, sent{pid.Id, msg})
}

func (f *fakeRequestActors) messages() []sent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sent(nil), f.got...)
}

// fakeMembers is memberView: a fixed view and the last load set.
type fakeMembers struct {
	view requests.View
	load int64
}

func (m *fakeMembers) View() requests.View { return m.view }
func (m *fakeMembers) SetLoad(l int64)     { m.load = l }

type fakeInstances map[string]string

func (f fakeInstances) engineInstance(id string) string { return f[id] }

type fakeLocal []string

func (f fakeLocal) Engines() []string { return f }

func newTestRequestAPI(running ...string) (*requestAPI, *fakeRequestActors, *fakeMembers) {
	acts, mem := newFakeRequestActors(running...), &fakeMembers{}
	return &requestAPI{member: "m1", max: 2, actors: acts, store: &fakeStore{}, instances: fakeInstances{"d1": "i1"},
		local: fakeLocal{"d1", "d2"}, members: mem, clock: clock.NewFake(time.Unix(1000, 0))}, acts, mem
}

func TestRequestsNeedTheStore(t *testing.T) {
	a, _, _ := newTestRequestAPI()
	a.store = nil
	_, err := a.StartRequest(context.Background(), &messages.StartRequestMsg{RequestId: "r1", EngineId: "d1"})
	wantCode(t, "request.start without JetStream", err, api.CodePeerUnavailable)
	_, err = a.Adopt(context.Background(), &messages.AdoptRequestMsg{RequestId: "r1", DeadOwner: "m2"})
	wantCode(t, "request.adopt without JetStream", err, api.CodePeerUnavailable)
}

func TestStartRequestBoundedByRequestsMax(t *testing.T) {
	a, acts, mem := newTestRequestAPI("r1")
	ctx := context.Background()
	_, err := a.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "bad id", EngineId: "d1"})
	wantCode(t, "request.start with a malformed id", err, api.CodeBadRequest)
	if _, err := a.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "r2", EngineId: "d1", Params: heldBy("p1")}); err != nil {
		t.Fatal(err)
	}
	if mem.load != 2 {
		t.Fatalf("advertised load %d after a start, want 2", mem.load)
	}
	start, ok := acts.messages()[0].msg.(*actors.StartRequest)
	if !ok || start.Instance != "i1" {
		t.Fatalf("spawned with %+v, want a StartRequest of the engine's live instance i1", acts.messages()[0].msg)
	}
	_, err = a.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "r3", EngineId: "d1", Params: heldBy("p1")})
	wantCode(t, "request.start over requests_max", err, api.CodeOverloaded)
	// A takeover of a request running here is no new request: not refused
	// for the bound, and told to the running actor.
	if _, err := a.StartRequest(ctx, &messages.StartRequestMsg{RequestId: "r1", EngineId: "d1", Takeover: true, Params: heldBy("p1")}); err != nil {
		t.Fatal(err)
	}
	last := acts.messages()[len(acts.messages())-1]
	if _, ok := last.msg.(*actors.TakeoverRequest); !ok || last.to != "r1" {
		t.Fatalf("takeover sent %+v to %s, want a TakeoverRequest to r1", last.msg, last.to)
	}
}

// heldBy is a request's params with its hold on member holder.
func heldBy(holder string) *messages.KVTransferParams {
	return &messages.KVTransferParams{TransferId: "0123456789abcdef0123456789abcdef", RemoteCtrl: &messages.RemoteCtrl{Member: holder}}
}

// TestStartRequestHolderIsAToken: the request actor renews and releases
// the hold on the holder's subjects with the member's rights, so an
// engine's params may not name a holder that is not one subject token
// (it would direct them at another engine's notices or scoped API).
func TestStartRequestHolderIsAToken(t *testing.T) {
	a, acts, _ := newTestRequestAPI()
	for _, holder := range []string{"", "engine.victim", "m2.e.d1", "*", ">", "a b"} {
		_, err := a.StartRequest(context.Background(), &messages.StartRequestMsg{RequestId: "r1", EngineId: "d1", Params: heldBy(holder)})
		wantCode(t, "request.start with holder "+holder, err, api.CodeBadRequest)
	}
	if n := len(acts.messages()); n != 0 {
		t.Fatalf("%d request actors told to start", n)
	}
}

func TestAdoptOnlyDepartedOwners(t *testing.T) {
	a, acts, mem := newTestRequestAPI()
	ctx := context.Background()
	mem.view = requests.View{Present: map[string]bool{"m2": true}}
	_, err := a.Adopt(ctx, &messages.AdoptRequestMsg{RequestId: "r1", DeadOwner: "m2"})
	wantCode(t, "adopt from an owner live in the view", err, api.CodeBadRequest)
	mem.view = requests.View{Present: map[string]bool{}}
	a.local = fakeLocal{}
	_, err = a.Adopt(ctx, &messages.AdoptRequestMsg{RequestId: "r1", DeadOwner: "m2"})
	wantCode(t, "adopt with no local decode engine", err, api.CodeUnknownRegion)
	a.local = fakeLocal{"d1", "d2"}
	var observed []float64
	a.adopted = func(s float64) { observed = append(observed, s) }
	departed := a.clock.Now().Add(-3 * time.Second)
	if _, err := a.Adopt(ctx, &messages.AdoptRequestMsg{RequestId: "r1", DeadOwner: "m2", DepartedUnixMs: departed.UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	ad, ok := acts.messages()[0].msg.(*actors.AdoptRequest)
	if !ok || ad.Engine != "d1" || ad.DeadOwner != "m2" {
		t.Fatalf("spawned with %+v, want an AdoptRequest onto the smallest local engine d1", acts.messages()[0].msg)
	}
	if len(observed) != 1 || observed[0] != 3 {
		t.Fatalf("failover observed %v, want [3] seconds", observed)
	}
}

func TestRequestCallsOfRequestsNotHere(t *testing.T) {
	a, acts, _ := newTestRequestAPI("r1")
	ctx := context.Background()
	_, err := a.Progress(ctx, &messages.RequestProgress{RequestId: "r9"})
	wantCode(t, "progress of a request not running here", err, api.CodeUnknownRequest)
	acts.askErr = actor.ErrDeadLetter
	_, err = a.FinishRequest(ctx, &messages.FinishRequestMsg{RequestId: "r1"})
	wantCode(t, "finish of a request whose actor stopped", err, api.CodeUnknownRequest)
	// Not here: inspect reads the durable state.
	a.store = &fakeStore{st: storedState("d1", tid1, 2)}
	st, err := a.InspectRequest(ctx, &messages.RequestRef{RequestId: "r9"})
	if err != nil || st.Status != "stored" || st.GetState().GetEpoch() != 2 {
		t.Fatalf("inspect of a stored request: %v, %v", st, err)
	}
}

func TestGrantTakeoverIsUsedOnce(t *testing.T) {
	a, _, _ := newTestRequestAPI()
	_, err := a.GrantTakeover(context.Background(), &messages.StartRequestMsg{RequestId: "r1", EngineId: "d.2"})
	wantCode(t, "grant to an engine id that is no token", err, api.CodeBadRequest)
	if _, err := a.GrantTakeover(context.Background(), &messages.StartRequestMsg{RequestId: "r1", EngineId: "d2"}); err != nil {
		t.Fatal(err)
	}
	now := a.clock.Now()
	if a.grants.Take("r1", "d3", now) {
		t.Fatal("a grant to d2 let d3 take the request")
	}
	if !a.grants.Take("r1", "d2", now) || a.grants.Take("r1", "d2", now) {
		t.Fatal("a grant is not taken exactly once")
	}
}

func TestEndEngineTellsEveryRequest(t *testing.T) {
	a, acts, _ := newTestRequestAPI("r1", "r2")
	a.endEngine("d1", "i1")
	got := acts.messages()
	if len(got) != 2 {
		t.Fatalf("%d messages, want EngineLost to both requests", len(got))
	}
	for _, s := range got {
		if l, ok := s.msg.(*actors.EngineLost); !ok || l.Engine != "d1" || l.Instance != "i1" {
			t.Fatalf("%s got %+v, want EngineLost d1/i1", s.to, s.msg)
		}
	}
}
