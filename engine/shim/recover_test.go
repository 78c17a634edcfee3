package shim

import (
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// fakeConnexd answers engine e1's calls on member m1 with handler, over a
// real NATS server; it returns the engine (its allocator over 8 blocks).
func fakeConnexd(t *testing.T, handle func(ep string, data []byte) proto.Message) *Engine {
	t.Helper()
	s, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(s.Shutdown)
	conn := func() *nats.Conn {
		nc, err := nats.Connect(s.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	srv, nc := conn(), conn()
	for _, ep := range []string{api.EpHoldCreate, api.EpHoldRelease, api.EpEngineNotices, api.EpEngineState} {
		if _, err := srv.Subscribe(api.EngineSubject("m1", "e1", ep), func(m *nats.Msg) {
			b, err := proto.Marshal(handle(ep, m.Data))
			if err == nil {
				err = m.Respond(b)
			}
			if err != nil {
				t.Errorf("fake connexd, %s: %v", ep, err)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Flush(); err != nil {
		t.Fatal(err)
	}
	return &Engine{
		cfg: Config{NC: nc, Member: "m1", EngineID: "e1", RegionID: "r1", CallTimeout: time.Second}, log: slog.New(slog.DiscardHandler),
		cli: &api.Client{NC: nc, Member: "m1", Engine: "e1"}, pulls: map[string]chan *messages.PullDone{},
		alloc: NewAllocator(8), avail: make(chan struct{}),
	}
}

// TestHoldDuringRegionRecoveryIsRefused: a hold asked while the engine
// re-creates its region (connexd restarted) would name KV the new region
// does not have: refused before hold.create; and one whose hold.create was
// answered after the recovery began is released, not recorded (the
// recovery drops the holds it finds).
func TestHoldDuringRegionRecoveryIsRefused(t *testing.T) {
	var creates, releases atomic.Int32
	var e *Engine
	e = fakeConnexd(t, func(ep string, _ []byte) proto.Message {
		switch ep {
		case api.EpHoldCreate:
			creates.Add(1)
			e.mu.Lock()
			e.recovering = true // connexd restarted while the call was out
			e.mu.Unlock()
			return &messages.CreateHoldReply{Params: &messages.KVTransferParams{TransferId: "t1"}}
		case api.EpHoldRelease:
			releases.Add(1)
		}
		return &messages.HoldStatus{}
	})
	blocks, _ := e.alloc.Alloc(2)
	if _, err := e.Hold(t.Context(), blocks, 32); !errors.Is(err, ErrRegionLost) {
		t.Fatalf("a hold answered during the recovery: %v, want ErrRegionLost", err)
	}
	if creates.Load() != 1 || releases.Load() != 1 || e.alloc.Held() != 0 {
		t.Fatalf("creates %d, releases %d, holds recorded %d; want 1, 1 and 0", creates.Load(), releases.Load(), e.alloc.Held())
	}
	if _, err := e.Hold(t.Context(), blocks, 32); !errors.Is(err, ErrRegionLost) || creates.Load() != 1 {
		t.Fatalf("a hold during the recovery: %v after %d creates; want ErrRegionLost and no hold.create", err, creates.Load())
	}
}

// TestHoldSpanningAWholeRecoveryIsRefused: a recovery that began and ended
// while hold.create was out (the flag is down again at the answer) still
// refuses the hold: it may be on the new region, without this KV.
func TestHoldSpanningAWholeRecoveryIsRefused(t *testing.T) {
	var releases atomic.Int32
	var e *Engine
	e = fakeConnexd(t, func(ep string, _ []byte) proto.Message {
		switch ep {
		case api.EpHoldCreate:
			e.mu.Lock()
			e.recoveries++ // a whole recovery while the call was out
			e.mu.Unlock()
			return &messages.CreateHoldReply{Params: &messages.KVTransferParams{TransferId: "t1"}}
		case api.EpHoldRelease:
			releases.Add(1)
		}
		return &messages.HoldStatus{}
	})
	blocks, _ := e.alloc.Alloc(2)
	if _, err := e.Hold(t.Context(), blocks, 32); !errors.Is(err, ErrRegionLost) || releases.Load() != 1 || e.alloc.Held() != 0 {
		t.Fatalf("a hold spanning a recovery: %v, %d releases, %d holds recorded; want ErrRegionLost, 1, 0", err, releases.Load(), e.alloc.Held())
	}
}

// TestLostNoticesRebuiltFromEngineState: engine.notices says missed
// notices are gone for good; the engine reads engine.state and gives back
// the blocks of the holds connexd no longer keeps, and only those.
func TestLostNoticesRebuiltFromEngineState(t *testing.T) {
	e := fakeConnexd(t, func(ep string, _ []byte) proto.Message {
		switch ep {
		case api.EpEngineNotices:
			return &messages.NoticesReply{Journal: "j1", LastSeq: 9, Gap: true}
		case api.EpEngineState:
			return &messages.EngineState{EngineId: "e1", Holds: []*messages.HoldStatus{
				{TransferId: "t2", State: "held"}, {TransferId: "t3", State: "released", Freed: true},
			}}
		}
		return &messages.HoldStatus{}
	})
	for _, id := range []string{"t1", "t2", "t3"} {
		ids, _ := e.alloc.Alloc(2)
		if _, err := e.alloc.Hold(id, ids); err != nil {
			t.Fatal(err)
		}
	}
	e.cursor.Reset("j1", 2)
	e.cursor.mu.Lock()
	ok := e.catchUpLocked()
	e.cursor.mu.Unlock()
	if !ok {
		t.Fatal("catch-up failed")
	}
	if held, free := e.alloc.Held(), e.alloc.FreeCount(); held != 1 || free != 6 {
		t.Fatalf("held %d free %d, want t2 alone held (t1 gone, t3 freed), 6 free", held, free)
	}
}
