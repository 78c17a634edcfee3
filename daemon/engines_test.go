package daemon

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/advertise"
	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/cluster"
	"github.com/connex/connex/messages"
)

// fakeAdvertiser is advertiser: every list advertised, in order.
type fakeAdvertiser struct {
	mu   sync.Mutex
	adds [][]string
}

func (f *fakeAdvertiser) SetEngines(es []*messages.EngineInfo) {
	var ids []string
	for _, e := range es {
		ids = append(ids, e.GetEngineId())
	}
	f.mu.Lock()
	f.adds = append(f.adds, ids)
	f.mu.Unlock()
}

// last is the last list advertised, and whether there was one.
func (f *fakeAdvertiser) last() ([]string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.adds) == 0 {
		return nil, false
	}
	return f.adds[len(f.adds)-1], true
}

// fakeEnder is requestEnder: the engine instances whose requests ended.
type fakeEnder struct {
	mu    sync.Mutex
	ended []string
}

func (f *fakeEnder) endEngine(engine, instance string) {
	f.mu.Lock()
	f.ended = append(f.ended, engine+"/"+instance)
	f.mu.Unlock()
}

func (f *fakeEnder) all() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ended...)
}

// fakeJournal is noticeMarks.
type fakeJournal struct {
	last      map[string]uint64
	forgotten []string
}

func (j *fakeJournal) Last(engine string) uint64 { return j.last[engine] }
func (j *fakeJournal) Forget(engine string)      { j.forgotten = append(j.forgotten, engine) }

type fakeBlocks uint32

func (b fakeBlocks) EngineBlocks(string) uint32 { return uint32(b) }

func newTestEngineAPI(role string) (*engineAPI, *fakeAdvertiser, *fakeEnder, *clock.Fake, *fakeJournal) {
	adv, end, clk := &fakeAdvertiser{}, &fakeEnder{}, clock.NewFake(time.Unix(1000, 0))
	j := &fakeJournal{last: map[string]uint64{"d1": 41}}
	return &engineAPI{member: "m1", role: role, reg: advertise.NewRegistry(), blocks: fakeBlocks(100), journal: j, journalID: "j1",
		adv: adv, requests: end, clock: clk, stop: make(chan struct{}), log: quiet}, adv, end, clk, j
}

func registration(id, instance, role string, ttlMs uint32) *messages.RegisterEngineRequest {
	return &messages.RegisterEngineRequest{TtlMs: ttlMs, Engine: &messages.EngineInfo{EngineId: id, InstanceId: instance, Role: role,
		Model: "m", BaseUrl: "http://127.0.0.1:1", BlocksTotal: 500, BlocksFree: 400}}
}

func TestRegisteredEnginesAreAdvertised(t *testing.T) {
	a, adv, _, _, _ := newTestEngineAPI(advertise.RoleDecode)
	ctx := context.Background()
	rep, err := a.RegisterEngine(ctx, registration("d1", "i1", advertise.RoleDecode, 3000))
	if err != nil {
		t.Fatal(err)
	}
	if rep.NoticeSeq != 41 || rep.NoticeJournal != "j1" || rep.TtlMs != 3000 || rep.RenewMs != 1000 || !rep.PullAwaitsStart {
		t.Fatalf("reply %+v: want notice seq 41 of journal j1, ttl 3000 ms, renew every 1000 ms, pull_awaits_start", rep)
	}
	if ids, _ := adv.last(); len(ids) != 1 || ids[0] != "d1" {
		t.Fatalf("advertised %v after a registration, want [d1]", ids)
	}
	// Blocks are at most those of its regions here.
	if info := a.info("d1"); info.GetBlocksTotal() != 100 || info.GetBlocksFree() != 100 {
		t.Fatalf("registered blocks %d/%d, want clamped to the regions' 100", info.GetBlocksFree(), info.GetBlocksTotal())
	}
	_, err = a.RegisterEngine(ctx, registration("p1", "i2", advertise.RolePrefill, 3000))
	wantCode(t, "a prefill engine on a decode member", err, api.CodeForbidden)
	_, err = a.RegisterEngine(ctx, registration("d.2", "i2", advertise.RoleDecode, 3000))
	wantCode(t, "an engine id that is no token", err, api.CodeBadRequest)
	if ids, _ := adv.last(); len(ids) != 1 {
		t.Fatalf("advertised %v after refused registrations, want [d1] still", ids)
	}
}

func TestEngineGoneIsAdvertisedAndEndsItsRequestsAfterTheGrace(t *testing.T) {
	a, adv, end, clk, j := newTestEngineAPI(advertise.RoleDecode)
	if _, err := a.RegisterEngine(context.Background(), registration("d1", "i1", advertise.RoleDecode, 3000)); err != nil {
		t.Fatal(err)
	}
	a.drop("d1")
	if ids, ok := adv.last(); !ok || len(ids) != 0 {
		t.Fatalf("advertised %v after engine.gone, want none", ids)
	}
	if len(j.forgotten) != 1 {
		t.Fatalf("journal forgot %v, want d1's notices forgotten", j.forgotten)
	}
	clk.Advance(engineLostGrace - time.Millisecond)
	if got := end.all(); len(got) != 0 {
		t.Fatalf("requests of d1 ended before the grace: %v", got)
	}
	clk.Advance(time.Millisecond)
	if got := end.all(); len(got) != 1 || got[0] != "d1/i1" {
		t.Fatalf("ended %v after the grace, want d1/i1", got)
	}
}

func TestRestartedEngineEndsTheOldInstancesRequestsOnly(t *testing.T) {
	a, _, end, clk, _ := newTestEngineAPI(advertise.RoleDecode)
	ctx := context.Background()
	if _, err := a.RegisterEngine(ctx, registration("d1", "i1", advertise.RoleDecode, 3000)); err != nil {
		t.Fatal(err)
	}
	// The same instance again (a renewal): nothing ends.
	if _, err := a.RegisterEngine(ctx, registration("d1", "i1", advertise.RoleDecode, 3000)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(engineLostGrace)
	if got := end.all(); len(got) != 0 {
		t.Fatalf("a renewal ended requests: %v", got)
	}
	// A new instance: the old one's requests end.
	if _, err := a.RegisterEngine(ctx, registration("d1", "i2", advertise.RoleDecode, 3000)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(engineLostGrace)
	if got := end.all(); len(got) != 1 || got[0] != "d1/i1" {
		t.Fatalf("ended %v after a restart, want the old instance d1/i1 only", got)
	}
}

func TestLapsedEngineBackWithinTheGraceKeepsItsRequests(t *testing.T) {
	a, adv, end, clk, _ := newTestEngineAPI(advertise.RoleDecode)
	ctx := context.Background()
	if _, err := a.RegisterEngine(ctx, registration("d1", "i1", advertise.RoleDecode, uint32(advertise.MinTTL.Milliseconds()))); err != nil {
		t.Fatal(err)
	}
	clk.Advance(advertise.MinTTL + time.Millisecond)
	a.advertise() // as expire does on its timer
	if ids, _ := adv.last(); len(ids) != 0 {
		t.Fatalf("a lapsed registration still advertised: %v", ids)
	}
	// Paused, not gone: the same instance registers again within the grace.
	if _, err := a.RegisterEngine(ctx, registration("d1", "i1", advertise.RoleDecode, 3000)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(engineLostGrace)
	if got := end.all(); len(got) != 0 {
		t.Fatalf("requests of an engine back within the grace ended: %v", got)
	}
}

// TestLoopsWaitForARegistration: with nothing registered, the expiry and
// probe loops wait for a registration (a router, which hosts no engine,
// would otherwise wake four times a second each for nothing); a
// registration releases them, and so does stop. A lapsed registration
// still counts as one (the expiry loop must see it to end it).
func TestLoopsWaitForARegistration(t *testing.T) {
	a, _, _, clk, _ := newTestEngineAPI(advertise.RoleDecode)
	stop := make(chan struct{})
	a.stop = stop
	released := make(chan bool, 2)
	for range 2 {
		go func() { released <- a.awaitRegistration() }()
	}
	select {
	case <-released:
		t.Fatal("awaitRegistration returned with nothing registered")
	case <-time.After(50 * time.Millisecond): // a wrong early return shows within this; a correct wait never returns
	}
	if _, err := a.RegisterEngine(context.Background(), registration("d1", "i1", advertise.RoleDecode, 3000)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case ok := <-released:
			if !ok {
				t.Fatal("awaitRegistration reported stop at a registration")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a registration did not release a waiting loop")
		}
	}
	clk.Advance(time.Hour) // lapsed, not yet dropped
	if !a.awaitRegistration() {
		t.Fatal("a lapsed registration not yet dropped does not count")
	}
	a.mu.Lock()
	a.reg.Live(clk.Now()) // dropped
	a.mu.Unlock()
	go func() { released <- a.awaitRegistration() }()
	close(stop)
	select {
	case ok := <-released:
		if ok {
			t.Fatal("awaitRegistration reported a registration at stop")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stop did not release a waiting loop")
	}
}

// TestLapseReadFirstByAnyoneIsEnded: reading the registry drops what
// lapsed, so the probe loop or a status call reading it before the expiry
// loop must end the lapse itself (CI caught the probe loop, woken in step
// with a registration, swallowing one: the engine's request then ran on).
// TestLapseReadByARegistrationIsEnded: a new engine's registration makes
// room by dropping what lapsed; when it is the first to read the registry
// after a lapse, it ends the lapse as the loops would.
func TestLapseReadByARegistrationIsEnded(t *testing.T) {
	a, adv, end, clk, _ := newTestEngineAPI(advertise.RoleDecode)
	ttl := advertise.MinTTL
	if _, err := a.RegisterEngine(context.Background(), registration("d1", "i1", advertise.RoleDecode, uint32(ttl.Milliseconds()))); err != nil {
		t.Fatal(err)
	}
	clk.Advance(ttl)
	if _, err := a.RegisterEngine(context.Background(), registration("d2", "i2", advertise.RoleDecode, 3000)); err != nil {
		t.Fatal(err)
	}
	if ids, ok := adv.last(); !ok || len(ids) != 1 || ids[0] != "d2" {
		t.Fatalf("advertised %v after d1 lapsed and d2 registered, want [d2]", ids)
	}
	clk.Advance(engineLostGrace)
	if got := end.all(); len(got) != 1 || got[0] != "d1/i1" {
		t.Fatalf("ended %v after a lapse read by another engine's registration, want d1/i1", got)
	}
}

func TestLapseReadFirstByAnyoneIsEnded(t *testing.T) {
	a, adv, end, clk, _ := newTestEngineAPI(advertise.RoleDecode)
	ttl := advertise.MinTTL
	if _, err := a.RegisterEngine(context.Background(), registration("d1", "i1", advertise.RoleDecode, uint32(ttl.Milliseconds()))); err != nil {
		t.Fatal(err)
	}
	clk.Advance(ttl)
	if live := a.live(); len(live) != 0 { // the probe loop's and status's read
		t.Fatalf("live after the TTL: %v", live)
	}
	if ids, ok := adv.last(); !ok || len(ids) != 0 {
		t.Fatalf("advertised %v after the lapse, want none", ids)
	}
	clk.Advance(engineLostGrace)
	if got := end.all(); len(got) != 1 || got[0] != "d1/i1" {
		t.Fatalf("ended %v after a lapse read by live(), want d1/i1", got)
	}
}

type fakeMemberList []cluster.Member

func (f fakeMemberList) Members() []cluster.Member { return f }

// TestEngineIDServedElsewhereIsRefused: notices and replies are addressed
// by engine id alone, so an engine whose id another member serves would
// read that engine's (its pulls, its resumes with their prompts): its
// registration is refused, naming the member; an id nobody else serves,
// or one this member itself advertises, registers.
func TestEngineIDServedElsewhereIsRefused(t *testing.T) {
	a, _, _, _, _ := newTestEngineAPI(advertise.RoleDecode)
	a.peers = fakeMemberList{
		{Name: "m1", Engines: []*messages.EngineInfo{{EngineId: "d3"}}}, // ourselves
		{Name: "m2", Engines: []*messages.EngineInfo{{EngineId: "d1"}}},
		{Name: "", Engines: []*messages.EngineInfo{{EngineId: "d2"}}}, // not a connexd
	}
	_, err := a.RegisterEngine(context.Background(), registration("d1", "i1", advertise.RoleDecode, 3000))
	wantCode(t, "engine.register of an id member m2 serves", err, api.CodeForbidden)
	if err == nil || !strings.Contains(err.Error(), "member m2") {
		t.Fatalf("the refusal does not name the member: %v", err)
	}
	for _, id := range []string{"d2", "d3", "d4"} {
		if _, err := a.RegisterEngine(context.Background(), registration(id, "i1", advertise.RoleDecode, 3000)); err != nil {
			t.Fatalf("engine.register of %s: %v", id, err)
		}
	}
	// Two members that took one id in the same moment: the one registered
	// here keeps renewing (refusing renewals would make the pair flap).
	a.peers = append(a.peers.(fakeMemberList), cluster.Member{Name: "m3", Engines: []*messages.EngineInfo{{EngineId: "d4"}}})
	if _, err := a.RegisterEngine(context.Background(), registration("d4", "i1", advertise.RoleDecode, 3000)); err != nil {
		t.Fatalf("renewal of d4, which m3 now advertises too: %v", err)
	}
}
