package pull

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// fakeHolder is member h1's peer.descriptors and peer.pullend on a real
// NATS server: it records what reaches it and answers every descriptors
// request with descriptors of no block (a pull that reads them fails "bad
// descriptors" at once, after it has taken them).
type fakeHolder struct {
	// refuse answers the reservations' descriptors requests not_yours
	// (the hold not bound yet), as a lagging request store would.
	refuse bool
	mu     sync.Mutex
	asks   []*messages.DescriptorsRequest
	ends   []*messages.PullEnd
	ended  chan *messages.PullEnd
}

func startFakeHolder(t *testing.T, nc *nats.Conn) *fakeHolder {
	t.Helper()
	h := &fakeHolder{ended: make(chan *messages.PullEnd, 16)}
	sub, err := nc.Subscribe(api.Subject("h1", api.EpPeerDescriptors), func(m *nats.Msg) {
		r := new(messages.DescriptorsRequest)
		if api.Unmarshal(m.Data, false, 1<<20, r) != nil {
			return
		}
		h.mu.Lock()
		h.asks = append(h.asks, r)
		refuse := h.refuse && strings.HasPrefix(r.PullId, "rsv-")
		h.mu.Unlock()
		if refuse {
			out := nats.NewMsg(m.Reply)
			out.Header.Set(api.HeaderErrorCode, strconv.Itoa(int(api.CodeNotYours)))
			out.Header.Set(api.HeaderError, "not bound yet")
			_ = m.RespondMsg(out)
			return
		}
		data, _ := api.Marshal(&messages.Descriptors{TransferId: r.TransferId, RemoteCtrl: &messages.RemoteCtrl{Member: "h1", Backend: "elsewhere"}}, false)
		_ = m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	sub2, err := nc.Subscribe(api.Subject("h1", api.EpPeerPullEnd), func(m *nats.Msg) {
		r := new(messages.PullEnd)
		if api.Unmarshal(m.Data, false, 1<<20, r) != nil {
			return
		}
		h.mu.Lock()
		h.ends = append(h.ends, r)
		h.mu.Unlock()
		data, _ := api.Marshal(&messages.HoldStatus{TransferId: r.TransferId}, false)
		_ = m.Respond(data)
		h.ended <- r
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub2.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return h
}

// readIDs are the read ids of the descriptors requests that reached h.
func (h *fakeHolder) readIDs() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ids []string
	for _, a := range h.asks {
		ids = append(ids, a.PullId)
	}
	return ids
}

func (h *fakeHolder) waitEnd(t *testing.T) *messages.PullEnd {
	t.Helper()
	select {
	case e := <-h.ended:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no PullEnd reached the holder within 10 s")
		return nil
	}
}

func testNATS(t *testing.T) *nats.Conn {
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
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestReservation checks what only the wiring of reservations can get
// wrong: a pull that fits its engine's reservation reads from the
// reservation's answer without asking the holder again, and ends the
// holder's read under the reservation's read id; a reservation nobody
// takes (its time passes, its request finishes, the pull does not fit it)
// ends its read at the holder, and the pull then asks for itself.
func TestReservation(t *testing.T) {
	nc := testNATS(t)
	l := kvmem.Layout{Layers: 2, Planes: 2, Blocks: 8, BlockBytes: 16, BlockSize: 4, TPSize: 1}
	params := &messages.KVTransferParams{TransferId: "t1", RemoteCtrl: &messages.RemoteCtrl{Member: "h1", Backend: "idle"}, RemoteBlockIds: []uint32{0, 1}, RetainS: 60}
	for _, c := range []struct {
		name string
		// before runs between the reservation and pull.start (nil: no
		// pull.start).
		before func(t *testing.T, deps *PullDeps, fc *clock.Fake, h *fakeHolder)
		dst    kvmem.Layout
		taken  bool // the pull takes the reservation
		refuse bool // the holder refuses the reservation
	}{
		{name: "taken", dst: l, taken: true},
		// Taken, refused: the pull ends it and asks for itself.
		{name: "refused", dst: l, refuse: true},
		{name: "unused until its time is up", before: func(t *testing.T, deps *PullDeps, fc *clock.Fake, h *fakeHolder) {
			fc.Advance(reserveTTL)
			if e := h.waitEnd(t); e.Ok || !strings.HasPrefix(e.PullId, "rsv-") || e.Requester != "e" {
				t.Fatalf("PullEnd of the unused reservation: %v", e)
			}
		}, dst: l},
		{name: "its request finished", before: func(t *testing.T, deps *PullDeps, _ *clock.Fake, h *fakeHolder) {
			deps.Unreserve("r1")
			if e := h.waitEnd(t); e.Ok || !strings.HasPrefix(e.PullId, "rsv-") {
				t.Fatalf("PullEnd of the finished request's reservation: %v", e)
			}
		}, dst: l},
		{name: "another layout", dst: kvmem.Layout{Layers: 2, Planes: 2, Blocks: 9, BlockBytes: 16, BlockSize: 4, TPSize: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := startFakeHolder(t, nc)
			h.refuse = c.refuse
			fc := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			dones := make(chan *messages.PullDone, 1)
			deps := &PullDeps{Backend: idleBackend{}, NC: nc, Notify: func(d *messages.PullDone) { dones <- d },
				Log: slog.New(slog.DiscardHandler), Metrics: &actors.Metrics{}, Ctx: context.Background(), Clock: fc}
			deps.Reserve("e", "r1", params, l, time.Minute)
			if c.before != nil {
				c.before(t, deps, fc, h)
			}
			dst := mapped(t, c.dst)
			if err := dst.Blocks.BeginWrite([]uint32{1, 2}); err != nil {
				t.Fatal(err)
			}
			// The reservation's answer is in before the pull starts.
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			StartPuller(deps, &Pull{ID: "p1", Params: params, Dst: dst, DstBlocks: []uint32{1, 2}, Timeout: time.Minute, Stall: time.Minute, ReleaseRegion: func() {}})
			var d *messages.PullDone
			select {
			case d = <-dones:
			case <-time.After(10 * time.Second):
				t.Fatal("no PullDone within 10 s")
			}
			if d.Ok || !strings.Contains(d.Error, "bad descriptors") || d.PullId != "p1" {
				t.Fatalf("PullDone %v: want pull p1 failed on the holder's descriptors", d)
			}
			// The pull's own PullEnd (not ok: its read failed), and for
			// a reservation that did not fit, the reservation's.
			ids := h.readIDs()
			want := map[string]bool{"p1": !c.taken}
			if len(ids) > 0 {
				want[ids[0]] = c.taken || c.before == nil
			}
			switch {
			case c.taken && (len(ids) != 1 || !strings.HasPrefix(ids[0], "rsv-")):
				t.Fatalf("reads asked %v: want the reservation's one read", ids)
			case !c.taken && (len(ids) != 2 || !strings.HasPrefix(ids[0], "rsv-") || ids[1] != "p1"):
				t.Fatalf("reads asked %v: want the reservation's, then the pull's own", ids)
			}
			for id, w := range want {
				if !w {
					delete(want, id)
				}
			}
			for len(want) > 0 {
				e := h.waitEnd(t)
				if e.Ok {
					t.Fatalf("PullEnd %v says ok", e)
				}
				delete(want, e.PullId)
			}
			// The counters an operator reads: a reservation a pull took,
			// or one dropped unused.
			took, dropped := int64(0), int64(1)
			if c.taken || c.refuse {
				took, dropped = 1, 0
			}
			if a, b := deps.Metrics.ReservationsTaken.Load(), deps.Metrics.ReservationsDropped.Load(); a != took || b != dropped {
				t.Fatalf("reservations taken %d, dropped %d; want %d, %d", a, b, took, dropped)
			}
			deps.reserved.mu.Lock()
			left := len(deps.reserved.m)
			deps.reserved.mu.Unlock()
			if left != 0 {
				t.Fatalf("%d reservations left after the pull", left)
			}
		})
	}
}

// TestReserveAfterClose: a stopping connexd reserves nothing and ends the
// reads it had reserved.
func TestReserveAfterClose(t *testing.T) {
	nc := testNATS(t)
	h := startFakeHolder(t, nc)
	l := kvmem.Layout{Layers: 2, Planes: 2, Blocks: 8, BlockBytes: 16, BlockSize: 4, TPSize: 1}
	params := &messages.KVTransferParams{TransferId: "t1", RemoteCtrl: &messages.RemoteCtrl{Member: "h1", Backend: "idle"}, RetainS: 60}
	deps := &PullDeps{Backend: idleBackend{}, NC: nc, Log: slog.New(slog.DiscardHandler), Metrics: &actors.Metrics{}}
	deps.Reserve("e", "r1", params, l, time.Minute)
	deps.CloseReservations()
	if e := h.waitEnd(t); e.Ok || !strings.HasPrefix(e.PullId, "rsv-") {
		t.Fatalf("PullEnd at close: %v", e)
	}
	deps.Reserve("e", "r2", &messages.KVTransferParams{TransferId: "t2", RemoteCtrl: params.RemoteCtrl}, l, time.Minute)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if ids := h.readIDs(); len(ids) != 1 {
		t.Fatalf("reads asked %v: want only the one reserved before the close", ids)
	}
}

// TestReservationFits: a pull takes a reservation only while its bytes
// fit what is left of the reserved read at the slowest rate, with the
// margin: a large pull, or one that comes late, asks for itself.
func TestReservationFits(t *testing.T) {
	l := kvmem.Layout{Layers: 2, Planes: 2, Blocks: 1024, BlockBytes: 1 << 20, BlockSize: 4, TPSize: 1}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &reservation{layout: l, member: "h1", sent: t0, deadline: t0.Add(reserveReadTimeout)}
	pull := func(blocks int) *Pull {
		return &Pull{Dst: &kvmem.Mapped{Region: &kvmem.Region{Layout: l}}, DstBlocks: make([]uint32, blocks),
			Params: &messages.KVTransferParams{RemoteCtrl: &messages.RemoteCtrl{Member: "h1"}}}
	}
	for _, c := range []struct {
		blocks int           // 4 MiB each
		at     time.Duration // after the reservation
		fits   bool
	}{
		{1, 0, true},
		{1, reserveTTL, true},
		{32, reserveTTL, true},  // 128 MiB: 2 s at the slowest rate + the margin: the 3 s left
		{33, reserveTTL, false}, // a block more does not fit
		{16, 3 * time.Second, true},
		{32, 3 * time.Second, false},
		{1, reserveReadTimeout - reserveMargin/2, false},
		{1024, 0, false},
	} {
		why := r.unfit(pull(c.blocks), t0.Add(c.at))
		if (why == "") != c.fits {
			t.Errorf("%d MiB at %s: unfit %q, want fits=%v", 4*c.blocks, c.at, why, c.fits)
		}
	}
	other := pull(1)
	other.Params.RemoteCtrl.Member = "h2"
	if why := r.unfit(other, t0); why == "" {
		t.Error("a pull from another holder fits")
	}
}

// TestReadBudget: a reserved read's pull may read until the holder would
// abandon the read: its timeout, capped at the lease.
func TestReadBudget(t *testing.T) {
	for _, c := range []struct {
		timeout time.Duration
		retainS uint32
		want    time.Duration
	}{
		{30 * time.Second, 60, 30 * time.Second},
		{30 * time.Second, 10, 10 * time.Second},
		{30 * time.Second, 0, 30 * time.Second},
	} {
		if got := readBudget(c.timeout, c.retainS); got != c.want {
			t.Errorf("readBudget(%s, %d) = %s, want %s", c.timeout, c.retainS, got, c.want)
		}
	}
}
