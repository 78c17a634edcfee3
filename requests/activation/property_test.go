package activation

import (
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
	"google.golang.org/protobuf/proto"
)

// TestRandomHistories drives up to four activations of one request, on
// different members, through random interleavings of calls, ticks and the
// results of their I/O against a model compare-and-set store and holder,
// and checks the invariants: at most one I/O in flight per activation; at
// most one live activation per request (no two activations ever run the
// same epoch, and at most one running activation matches the store); the
// hold released exactly once when the request's state was deleted with the
// hold not lost, and only by the activation that deleted it; nothing
// renewed after the end; an activation that found itself fenced never
// writes, renews or releases again; every call answered exactly once.
func TestRandomHistories(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	endings := map[string]int{}
	for iter := 0; iter < 2000; iter++ {
		h := newHistory(t, iter, rng)
		h.spawn(false)
		for step := 0; step < 60; step++ {
			h.step()
		}
		h.quiesce()
		endings[h.ending()]++
	}
	// The histories must reach every ending, or they test little.
	for _, e := range []string{"finished", "engine-lost", "fenced", "running", "grant-lapsed"} {
		if endings[e] == 0 {
			t.Errorf("no history ended %s: %v", e, endings)
		}
	}
	t.Logf("endings: %v", endings)
}

// node is one activation and what the test knows of it.
type node struct {
	a        *Activation
	self     string
	pending  Effect // the I/O effect in flight
	stopped  bool
	fenced   bool // it learned another activation owns the request
	ended    bool // it emitted Stop or Release
	deleted  bool // its Delete succeeded
	released bool
	calls    map[uint64]bool // calls not yet answered
}

type history struct {
	t     *testing.T
	iter  int
	rng   *rand.Rand
	now   time.Time
	nodes []*node
	// the model store: one request
	stored  *messages.RequestState
	rev     uint64
	deleted bool
	// the model holder
	holdGone  bool
	releases  int
	lostBy    map[*node]bool
	nextCall  uint64
	epochRuns map[uint64]*node // which activation ran each epoch
	// deleteEnding is how the request's deletion ended it: "finished" or
	// "engine-lost".
	deleteEnding string
}

func newHistory(t *testing.T, iter int, rng *rand.Rand) *history {
	return &history{t: t, iter: iter, rng: rng, now: time.Unix(0, 0), lostBy: map[*node]bool{}, epochRuns: map[uint64]*node{}}
}

func (h *history) fatalf(format string, args ...any) {
	h.t.Helper()
	h.t.Fatalf("iter %d: "+format, append([]any{h.iter}, args...)...)
}

func (h *history) msg(engine string, takeover bool) *messages.StartRequestMsg {
	return &messages.StartRequestMsg{RequestId: "r1", EngineId: engine, Takeover: takeover, PromptTokenIds: []uint32{1, 2, 3},
		Params: &messages.KVTransferParams{TransferId: "t1", RetainS: 30, RemoteCtrl: &messages.RemoteCtrl{Member: "p1"}}}
}

// spawn starts another activation on a member of its own: the first
// starts the request, later ones take it over or adopt it.
func (h *history) spawn(resume bool) {
	n := &node{self: fmt.Sprintf("m%d", len(h.nodes)+1), calls: map[uint64]bool{}}
	n.a = New(n.self)
	h.nodes = append(h.nodes, n)
	engine := "e-" + n.self
	call := h.call(n)
	r := h.rng.Intn(3)
	switch {
	case !resume:
		h.apply(n, Start{Now: h.now, Call: call, Msg: h.msg(engine, false)})
	case r == 0:
		// The router's grant moves it; the engine's takeover (a later
		// step) confirms it.
		h.apply(n, Grant{Now: h.now, Call: call, ID: "r1", Engine: engine})
	case r == 1 && h.stored != nil:
		h.apply(n, Adopt{Now: h.now, Call: call, ID: "r1", DeadOwner: h.stored.Owner, Engine: engine})
	default:
		h.apply(n, Start{Now: h.now, Call: call, Msg: h.msg(engine, true)})
	}
}

func (h *history) call(n *node) uint64 {
	h.nextCall++
	n.calls[h.nextCall] = true
	return h.nextCall
}

// step makes one random thing happen.
func (h *history) step() {
	h.now = h.now.Add(time.Duration(h.rng.Intn(3000)) * time.Millisecond)
	if len(h.nodes) < 4 && h.rng.Intn(15) == 0 {
		h.spawn(true)
		return
	}
	if h.rng.Intn(20) == 0 {
		h.holdGone = true // the hold expired
	}
	n := h.nodes[h.rng.Intn(len(h.nodes))]
	if n.stopped {
		return
	}
	if n.pending != nil && h.rng.Intn(2) == 0 {
		h.deliver(n)
		return
	}
	st := n.a.State()
	epoch := uint64(0)
	engine := ""
	if st != nil {
		epoch, engine = st.Epoch, st.EngineId
	}
	if h.rng.Intn(5) == 0 {
		epoch-- // a stale engine's call
	}
	switch h.rng.Intn(8) {
	case 0, 1:
		h.apply(n, Progress{Now: h.now, Call: h.call(n), Epoch: epoch, Tokens: []uint32{7}})
	case 2:
		h.apply(n, Finish{Now: h.now, Call: h.call(n), Epoch: epoch})
	case 3:
		h.apply(n, EngineLost{Now: h.now, Engine: engine})
	case 4, 5:
		h.apply(n, RenewTick{Now: h.now})
	case 6:
		h.apply(n, Inspect{Now: h.now, Call: h.call(n)})
	case 7:
		engine := "e-" + n.self // the granted engine's takeover, or a first start's own engine
		if h.rng.Intn(2) == 0 {
			engine = fmt.Sprintf("e-%s-%d", n.self, h.rng.Intn(100))
		}
		h.apply(n, Takeover{Now: h.now, Call: h.call(n), Msg: h.msg(engine, true)})
	}
}

// quiesce delivers every result in flight until nothing is.
func (h *history) quiesce() {
	for progress := true; progress; {
		progress = false
		for _, n := range h.nodes {
			if !n.stopped && n.pending != nil {
				h.deliver(n)
				progress = true
			}
		}
	}
	for _, n := range h.nodes {
		if len(n.calls) > 0 && n.a.Phase() == Ended {
			h.fatalf("%s ended with calls unanswered: %v", n.self, n.calls)
		}
	}
	wantReleases := 0
	for _, n := range h.nodes {
		if n.deleted && !h.lostBy[n] {
			wantReleases = 1
		}
	}
	if h.releases != wantReleases {
		h.fatalf("hold released %d times, want %d (deleted=%v)", h.releases, wantReleases, h.deleted)
	}
}

func (h *history) ending() string {
	switch {
	case h.deleted && h.releases == 1:
		return h.deleteEnding
	case h.deleted:
		return "deleted, hold lost"
	case h.anyFenced():
		return "fenced"
	}
	return "running"
}

func (h *history) anyFenced() bool {
	for _, n := range h.nodes {
		if n.fenced {
			return true
		}
	}
	return false
}

// apply steps n with ev and checks and performs the effects: Claim is
// answered at once, other I/O is left in flight for deliver.
func (h *history) apply(n *node, ev Event) {
	h.t.Helper()
	fx, err := n.a.Step(ev)
	if err != nil {
		h.fatalf("%s: step %T: %v", n.self, ev, err)
	}
	for _, e := range fx {
		h.check(n, e)
	}
	for _, e := range fx {
		if _, ok := e.(Claim); ok {
			h.apply(n, Claimed{Now: h.now, OK: true})
		}
	}
}

// check enforces the invariants on one effect of n.
func (h *history) check(n *node, e Effect) {
	h.t.Helper()
	switch e := e.(type) {
	case Load, Write, Renew, Release:
		if n.pending != nil {
			h.fatalf("%s: %T while %T is in flight", n.self, e, n.pending)
		}
		if n.fenced {
			h.fatalf("%s: fenced, yet %T", n.self, e)
		}
		if n.ended {
			h.fatalf("%s: ended, yet %T", n.self, e)
		}
		n.pending = e
	}
	switch e := e.(type) {
	case Renew:
		if n.a.HoldLost() {
			h.fatalf("%s: renews a lost hold", n.self)
		}
	case Release:
		if !n.deleted {
			h.fatalf("%s: releases a hold without having deleted the request", n.self)
		}
		if n.a.HoldLost() {
			h.fatalf("%s: releases a lost hold", n.self)
		}
		n.released = true
		n.ended = true
	case Reply:
		if !n.calls[e.Call] {
			h.fatalf("%s: reply to call %d, which is not waiting", n.self, e.Call)
		}
		delete(n.calls, e.Call)
		if e.Err == nil && e.Status == "running" && n.fenced {
			h.fatalf("%s: fenced, yet answers running", n.self)
		}
	case Stop:
		n.ended = true
		if n.deleted && h.deleteEnding == "" {
			switch {
			case e.Reason == "request finished":
				h.deleteEnding = "finished"
			case strings.Contains(e.Reason, "granted"):
				h.deleteEnding = "grant-lapsed"
			default:
				h.deleteEnding = "engine-lost"
			}
		}
	}
	// At most one live activation: no two activations run one epoch, and
	// at most one running activation matches the store.
	if st := n.a.State(); st != nil && n.a.Phase() == Running {
		if other, ok := h.epochRuns[st.Epoch]; ok && other != n {
			h.fatalf("%s and %s both ran epoch %d", other.self, n.self, st.Epoch)
		}
		h.epochRuns[st.Epoch] = n
	}
	live := 0
	for _, m := range h.nodes {
		if st := m.a.State(); st != nil && m.a.Phase() == Running && h.stored != nil && st.Owner == h.stored.Owner && st.Epoch == h.stored.Epoch && st.EngineId == h.stored.EngineId {
			live++
		}
	}
	if live > 1 {
		h.fatalf("%d live activations", live)
	}
}

// deliver runs n's I/O in flight against the model and steps the result.
func (h *history) deliver(n *node) {
	h.t.Helper()
	e := n.pending
	n.pending = nil
	down := h.rng.Intn(10) == 0
	switch e := e.(type) {
	case Load:
		switch {
		case down:
			h.apply(n, Loaded{Now: h.now, Err: errDown})
		case h.stored == nil:
			if n.a.Phase() == Running {
				n.fenced = true // it ended elsewhere
			}
			h.apply(n, Loaded{Now: h.now, Err: requests.ErrNotFound})
		default:
			if h.stored.Owner != n.self || h.stored.Epoch != n.a.State().GetEpoch() {
				// A keep-alive that reads another owner stops; a
				// takeover or adoption reads to write anyway.
				if n.a.Phase() == Running {
					n.fenced = true
				}
			}
			h.apply(n, Loaded{Now: h.now, State: proto.Clone(h.stored).(*messages.RequestState), Rev: h.rev})
		}
	case Write:
		var err error
		switch {
		case down:
			err = errDown
		case e.Op == Create && h.stored != nil:
			err = requests.ErrExists
		case e.Op == Create && h.deleted:
			err = requests.ErrExists // a finished request stays finished
		case e.Op != Create && (h.stored == nil || e.Rev != h.rev):
			err = fmt.Errorf("cas: %w", requests.ErrFenced)
		}
		if err == nil {
			h.rev++
			switch e.Op {
			case Delete:
				h.stored, h.deleted, n.deleted = nil, true, true
			default:
				h.stored = proto.Clone(e.State).(*messages.RequestState)
			}
		} else if errors.Is(err, requests.ErrFenced) && n.a.Phase() == Running {
			n.fenced = true
		}
		h.apply(n, Written{Now: h.now, Rev: h.rev, Err: err})
	case Renew:
		switch {
		case h.holdGone:
			h.lostBy[n] = true
			h.apply(n, Renewed{Now: h.now, Result: RenewGone, Code: 404, Reason: "expired"})
		case down:
			h.apply(n, Renewed{Now: h.now, Result: RenewFailed})
		default:
			h.apply(n, Renewed{Now: h.now, Result: RenewOK})
		}
	case Release:
		h.releases++
		h.holdGone = true
		h.apply(n, Released{Now: h.now})
	}
	if n.a.Phase() == Ended {
		n.stopped = true
	}
}
