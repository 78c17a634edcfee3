package shim

import (
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// TestAGapWhoseFetchFailedIsFetchedAgain: pull.done 4 arrives after a gap
// while engine.notices has no responder. It is handed on at once (its pull
// need not wait), the cursor stays before the gap, and the next renewal's
// catch-up delivers the missed 2 and 3 — which a cursor moved past the gap
// would have dropped as repeats, leaving their pulls to wait out their
// deadlines.
func TestAGapWhoseFetchFailedIsFetchedAgain(t *testing.T) {
	s, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	defer s.Shutdown()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	e := &Engine{
		cfg: Config{NC: nc, Member: "m1", EngineID: "e1", CallTimeout: time.Second}, log: slog.New(slog.DiscardHandler),
		cli: &api.Client{NC: nc, Member: "m1", Engine: "e1"}, pulls: map[string]chan *messages.PullDone{},
	}
	waiting := map[string]chan *messages.PullDone{}
	for _, id := range []string{"p2", "p3", "p4"} {
		waiting[id] = make(chan *messages.PullDone, 2)
		e.pulls[id] = waiting[id]
	}
	e.cursor.Reset("j1", 1)
	done := func(seq uint64) *messages.Notice {
		return &messages.Notice{Seq: seq, Kind: api.KindPullDone, Body: &messages.Notice_PullDone{PullDone: &messages.PullDone{PullId: "p" + strconv.FormatUint(seq, 10), Ok: true}}}
	}
	body, _ := proto.Marshal(done(4).GetPullDone())
	live := &nats.Msg{Subject: api.PullDoneSubject("m1", "e1"), Data: body, Header: nats.Header{}}
	live.Header.Set(api.HeaderNoticeSeq, "4")
	live.Header.Set(api.HeaderNoticeJournal, "j1")
	e.onNotice(live) // engine.notices: no responders

	if len(waiting["p4"]) != 1 {
		t.Fatal("pull.done 4 was not handed on while the missed notices could not be fetched")
	}
	if j, seq := e.cursor.Position(); j != "j1" || seq != 1 {
		t.Fatalf("the cursor moved to %s/%d past the gap; want it at j1/1", j, seq)
	}
	// connexd answers again: the renewal sees seq 4 and fetches 2..4.
	sub, err := nc.Subscribe(">", func(m *nats.Msg) {
		if m.Reply == "" {
			return
		}
		b, _ := proto.Marshal(&messages.NoticesReply{Journal: "j1", LastSeq: 4, Notices: []*messages.Notice{done(2), done(3), done(4)}})
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	e.caughtUp("j1", 4)
	for _, id := range []string{"p2", "p3"} {
		if len(waiting[id]) != 1 {
			t.Fatalf("pull.done of %s, missed before 4, was never handed on", id)
		}
	}
	if j, seq := e.cursor.Position(); j != "j1" || seq != 4 {
		t.Fatalf("after the catch-up the cursor is at %s/%d, want j1/4", j, seq)
	}
}
