package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/engine/shim"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// cutProxy forwards TCP connections to an upstream address until cut:
// then it closes every connection and refuses new ones until restored. It
// plays a network link to one client that goes down while the rest of the
// cluster stays connected.
type cutProxy struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	cut      bool
	conns    []net.Conn
}

func newCutProxy(t testing.TB, upstream string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, upstream: upstream}
	t.Cleanup(func() { ln.Close(); p.setCut(true) })
	go p.serve()
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		if !cut {
			p.conns = append(p.conns, c)
		}
		p.mu.Unlock()
		if cut {
			c.Close()
			continue
		}
		go func() {
			u, err := net.Dial("tcp", p.upstream)
			if err != nil {
				c.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, u)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			_, _ = io.Copy(c, u)
			c.Close()
		}()
	}
}

// setCut takes the link down (closing what is open) or brings it back.
func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// openDecodeShim opens a decode engine shim named id on member over nc,
// closed at the test's end.
func openDecodeShim(t *testing.T, nc *nats.Conn, member, id string) *shim.Engine {
	t.Helper()
	eng, err := shim.Open(ctx5(t), shim.Config{
		NC: nc, Member: member, EngineID: id, Role: shim.RoleDecode, Model: "m", BaseURL: "http://127.0.0.1:1",
		Layout: testLayout, RegisterTTL: 3 * time.Second, PullTimeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	return eng
}

// pullOutcome is what one engine-shim Pull returned.
type pullOutcome struct {
	d   *messages.PullDone
	err error
}

// frozenPulls holds blocks 2i and 2i+1 of pre for i < n, freezes the
// holder (SIGSTOP; SIGCONT at the test's end at the latest) and starts n
// pulls of them through eng into the same block ids, each on its own
// goroutine: their outcomes arrive on the returned channel.
func frozenPulls(t *testing.T, pre *engine, holder *proc, eng *shim.Engine, n int) <-chan pullOutcome {
	t.Helper()
	var params []*messages.KVTransferParams
	for i := range n {
		h, err := pre.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pre.id, RegionId: pre.rid, BlockIds: []uint32{uint32(2 * i), uint32(2*i + 1)}, NumTokens: 32})
		if err != nil {
			t.Fatal(err)
		}
		params = append(params, h.Params)
	}
	holder.signal(syscall.SIGSTOP)
	t.Cleanup(func() { holder.signal(syscall.SIGCONT) })
	out := make(chan pullOutcome, n)
	for i, p := range params {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			d, err := eng.Pull(ctx, p, []uint32{uint32(2 * i), uint32(2*i + 1)})
			out <- pullOutcome{d, err}
		}()
	}
	return out
}

// patientPair starts a prefill connexd "p" (its engine "engP" returned)
// and a decode connexd "d" whose pulls wait 10 s for a stalled holder, both
// on url with the lan preset.
func patientPair(t *testing.T, url string) (holder *proc, nc *nats.Conn, pre *engine) {
	t.Helper()
	holder = startConnexd(t, "p", "--backend", "tcp", "--nats-url", url, "--role", "prefill", "--cluster-preset", "lan")
	startConnexd(t, "d", "--backend", "tcp", "--nats-url", url, "--role", "decode", "--cluster-preset", "lan", "--pull-stall-ms", "10000")
	nc = connect(t, url)
	return holder, nc, newEngine(t, nc, "p", "engP", testLayout, true)
}

// reconnectingShim opens the decode engine "engD" of member "d" on its own
// NATS connection to url, which reconnects forever every 50 ms.
func reconnectingShim(t *testing.T, url string) *shim.Engine {
	t.Helper()
	enc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(enc.Close)
	return openDecodeShim(t, enc, "d", "engD")
}

// TestMissedPullDoneIsReplayed: pulls finish while their decode engine's
// NATS link is down (connexd stays connected, so their PullDone notices go
// out to nobody). When the link is back, the engine shim sees from its
// next engine.register reply that it is behind, replays the missed notices
// from connexd's journal (engine.notices), and every waiting pull returns
// its real outcome instead of timing out.
func TestMissedPullDoneIsReplayed(t *testing.T) {
	url := startNATS(t)
	holder, nc, pre := patientPair(t, url)

	proxy := newCutProxy(t, strings.TrimPrefix(url, "nats://"))
	eng := reconnectingShim(t, "nats://"+proxy.addr())

	const pulls = 4
	// The holder freezes (for less than the lan preset's 5 s hang
	// detection), so the pulls wait for its descriptors.
	out := frozenPulls(t, pre, holder, eng, pulls)
	state := func() *messages.EngineState {
		st, err := (&api.Client{NC: nc, Member: "d"}).EngineState(ctx5(t), &messages.EngineStateRequest{EngineId: "engD"})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	waitPulls := func(n int) {
		checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			if got := len(state().Pulls); got != n {
				return fmt.Errorf("%d pulls in flight, want %d", got, n)
			}
			return nil
		})
	}
	waitPulls(pulls)
	before := state().LastSeq

	// The engine's link goes down; the holder thaws; the pulls finish and
	// their notices are published while the engine cannot hear them.
	proxy.setCut(true)
	holder.signal(syscall.SIGCONT)
	waitPulls(0)
	if st := state(); st.LastSeq < before+pulls {
		t.Fatalf("journal at %d after the pulls, want at least %d", st.LastSeq, before+pulls)
	}
	select {
	case o := <-out:
		t.Fatalf("a pull returned while its engine was cut off: %v %v", o.d, o.err)
	default:
	}
	proxy.setCut(false)
	for range pulls {
		o := <-out
		if o.err != nil || !o.d.Ok {
			t.Fatalf("pull after the link came back: %v %v (want its real outcome, ok)", o.d, o.err)
		}
	}
	verifyBlocks(t, pre.region, eng.Region(), []uint32{0, 1, 2, 3, 4, 5, 6, 7}, []uint32{0, 1, 2, 3, 4, 5, 6, 7}, nil)
}

// TestJSONNoticesAndTheirJournal: an engine that registered with
// json_notices gets its notices as JSON, numbered in headers; the journal
// replays them from any sequence, and engine.state shows where it stands.
func TestJSONNoticesAndTheirJournal(t *testing.T) {
	url := startNATS(t)
	startConnexd(t, "p", "--backend", "tcp", "--nats-url", url, "--role", "prefill")
	nc := connect(t, url)
	e := newEngine(t, nc, "p", "engJ", testLayout, false)
	if _, err := e.cli.RegisterEngine(ctx5(t), &messages.RegisterEngineRequest{
		Engine: &messages.EngineInfo{EngineId: e.id, Role: "prefill", Model: "m", BaseUrl: "http://127.0.0.1:1", InstanceId: "i1", JsonNotices: true},
	}); err != nil {
		t.Fatal(err)
	}
	raw := make(chan *nats.Msg, 4)
	sub, err := nc.ChanSubscribe(api.EngineNotices(e.cli.Member, e.id), raw)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	h, err := e.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: e.id, RegionId: e.rid, BlockIds: []uint32{3, 4}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.Release(ctx5(t), &messages.HoldRef{TransferId: h.Params.TransferId, Requester: e.id}); err != nil {
		t.Fatal(err)
	}
	var m *nats.Msg
	select {
	case m = <-raw:
	case <-time.After(5 * time.Second):
		t.Fatal("no blocks.freed notice")
	}
	var freed messages.BlocksFreed
	if m.Subject != api.FreedSubject(e.cli.Member, e.id) || m.Header.Get(api.HeaderContentType) != api.ContentJSON ||
		api.Unmarshal(m.Data, true, len(m.Data), &freed) != nil || freed.TransferId != h.Params.TransferId {
		t.Fatalf("notice %s %v %s", m.Subject, m.Header, m.Data)
	}
	if !strings.Contains(string(m.Data), `"transfer_id"`) {
		t.Fatalf("JSON notice without the .proto field names: %s", m.Data)
	}
	seq, journal := m.Header.Get(api.HeaderNoticeSeq), m.Header.Get(api.HeaderNoticeJournal)
	if seq != "1" || journal == "" {
		t.Fatalf("notice headers seq=%q journal=%q, want 1 and a journal id", seq, journal)
	}
	rep, err := e.cli.EngineNotices(ctx5(t), &messages.NoticesRequest{EngineId: e.id, Journal: journal})
	if err != nil || len(rep.Notices) != 1 || rep.Notices[0].Kind != api.KindFreed || rep.Notices[0].Seq != 1 ||
		rep.Notices[0].GetBlocksFreed().GetTransferId() != h.Params.TransferId || rep.LastSeq != 1 || rep.Gap || rep.Journal != journal {
		t.Fatalf("replay from 0: %v %v", rep, err)
	}
	if rep, err := e.cli.EngineNotices(ctx5(t), &messages.NoticesRequest{EngineId: e.id, AfterSeq: 1, Journal: journal}); err != nil || len(rep.Notices) != 0 || rep.Gap {
		t.Fatalf("replay from the newest: %v %v", rep, err)
	}
	// A shim that saw another journal (connexd restarted) is told so.
	if rep, err := e.cli.EngineNotices(ctx5(t), &messages.NoticesRequest{EngineId: e.id, AfterSeq: 7, Journal: "old"}); err != nil || len(rep.Notices) != 1 || !rep.Gap {
		t.Fatalf("replay for another journal: %v %v", rep, err)
	}
	st, err := e.cli.EngineState(ctx5(t), &messages.EngineStateRequest{EngineId: e.id})
	if err != nil || st.LastSeq != 1 || st.Journal != journal || len(st.Holds) != 0 || st.Registration.GetInstanceId() != "i1" {
		t.Fatalf("engine.state: %v %v", st, err)
	}
	if _, err := e.cli.EngineNotices(ctx5(t), &messages.NoticesRequest{EngineId: "bad.id"}); api.CodeOf(err) != api.CodeBadRequest {
		t.Fatalf("engine.notices with a bad engine id: %v, want bad_request", err)
	}
}

// TestNATSRestartDuringPulls: NATS restarts while pulls wait on a frozen
// holder; engines and connexd reconnect, and every engine shim learns
// every pull's outcome — live, or replayed from connexd's journal — none
// waits until its own deadline for a notice that was lost.
func TestNATSRestartDuringPulls(t *testing.T) {
	ns := newRestartableNATS(t, true)
	url := ns.URL()
	holder, nc, pre := patientPair(t, url)
	eng := reconnectingShim(t, url)
	const pulls = 4
	// The holder freezes so that the pulls are still waiting when NATS
	// goes down.
	out := frozenPulls(t, pre, holder, eng, pulls)
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		st, err := (&api.Client{NC: nc, Member: "d"}).EngineState(ctx5(t), &messages.EngineStateRequest{EngineId: "engD"})
		if err != nil || len(st.Pulls) != pulls {
			return fmt.Errorf("pulls in flight: %v %v", st.GetPulls(), err)
		}
		return nil
	})
	ns.Stop()
	holder.signal(syscall.SIGCONT)
	ns.Start()
	for range pulls {
		o := <-out
		var le *shim.LoadError
		if o.err != nil && (!errors.As(o.err, &le) || le.Code == api.CodeTimeout && strings.Contains(le.Detail, "no pull.done")) {
			t.Fatalf("a pull's outcome never reached its engine: %v", o.err)
		}
		t.Logf("outcome: %v %v", o.d, o.err)
	}
}
