package actors

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/api"
	waitpoll "github.com/connex/connex/harness/poll"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
	"google.golang.org/protobuf/proto"
)

// memStore is a requests.Store in memory whose writes can be held at a
// gate, standing for a slow JetStream. It keeps what KVStore keeps: records
// and prompts apart (requests.SplitState), and counts the bytes each write
// stores.
type memStore struct {
	mu      sync.Mutex
	records map[string][]byte
	prompts map[string][]byte
	revs    map[string]uint64
	rev     uint64
	gate    chan struct{} // if set, Update waits for it to close
	waiting int           // Updates waiting at the gate
	written []int         // bytes stored by each Create and Update, in order
}

func newMemStore() *memStore {
	return &memStore{records: map[string][]byte{}, prompts: map[string][]byte{}, revs: map[string]uint64{}}
}

// put stores st's record, and its prompt if prompt; s.mu is held.
func (s *memStore) put(st *messages.RequestState, prompt bool) {
	n := 0
	if prompt {
		_, p := requests.SplitState(st)
		data, _ := proto.Marshal(p)
		s.prompts[st.PromptKey] = data
		n += len(data)
	}
	rec, _ := requests.RecordBytes(st)
	s.records[st.RequestId] = rec
	s.written = append(s.written, n+len(rec))
	s.rev++
	s.revs[st.RequestId] = s.rev
}

func (s *memStore) Create(_ context.Context, st *messages.RequestState) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.records[st.RequestId]; ok {
		return 0, requests.ErrExists
	}
	s.put(st, true)
	return s.rev, nil
}

func (s *memStore) Update(ctx context.Context, st *messages.RequestState, rev uint64, prompt bool) (uint64, error) {
	s.mu.Lock()
	gate := s.gate
	if gate != nil {
		s.waiting++
	}
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if gate != nil {
		s.waiting--
	}
	if cur, ok := s.revs[st.RequestId]; !ok || cur != rev {
		return 0, fmt.Errorf("update %s at %d: %w", st.RequestId, rev, requests.ErrFenced)
	}
	s.put(st, prompt)
	return s.rev, nil
}

func (s *memStore) Head(_ context.Context, id string) (*messages.RequestState, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, ok := s.records[id]
	if !ok {
		return nil, 0, requests.ErrNotFound
	}
	st := new(messages.RequestState)
	if err := proto.Unmarshal(data, st); err != nil {
		return nil, 0, err
	}
	return st, s.revs[id], nil
}

func (s *memStore) Get(ctx context.Context, id string) (*messages.RequestState, uint64, error) {
	st, rev, err := s.Head(ctx, id)
	if err != nil || st.PromptKey == "" {
		return st, rev, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := new(messages.RequestPrompt)
	if err := proto.Unmarshal(s.prompts[st.PromptKey], p); err != nil {
		return nil, 0, err
	}
	return requests.JoinState(st, p), rev, nil
}

func (s *memStore) Delete(_ context.Context, id string, rev uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.revs[id]; !ok || cur != rev {
		return fmt.Errorf("delete %s at %d: %w", id, rev, requests.ErrFenced)
	}
	delete(s.records, id)
	delete(s.revs, id)
	for k := range s.prompts {
		if strings.HasPrefix(k, "p."+id+".") {
			delete(s.prompts, k)
		}
	}
	return nil
}

// lastWrite is the bytes the last Create or Update stored.
func (s *memStore) lastWrite() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.written[len(s.written)-1]
}

func (s *memStore) waitingAtGate() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting
}

// countingHolds is HoldCalls that counts renewals and releases per
// transfer; gone makes renewals answer that the hold expired.
type countingHolds struct {
	mu       sync.Mutex
	renews   map[string]int
	releases map[string]int
	gone     bool
}

func (h *countingHolds) Renew(_ context.Context, _ string, ref *messages.HoldRef) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gone {
		return api.Errorf(api.CodeExpired, "transfer %s expired", ref.TransferId)
	}
	h.renews[ref.TransferId]++
	return nil
}

func (h *countingHolds) Release(_ context.Context, _ string, ref *messages.HoldRef) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.releases[ref.TransferId]++
	return nil
}

func (h *countingHolds) counts(transfer string) (renews, releases int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.renews[transfer], h.releases[transfer]
}

// notices records what request actors publish, by subject.
type notices struct {
	mu  sync.Mutex
	got map[string][]proto.Message
}

func (n *notices) publish(subject string, m proto.Message) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.got[subject] = append(n.got[subject], m)
}

func (n *notices) on(subject string) []proto.Message {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]proto.Message(nil), n.got[subject]...)
}

type requestRig struct {
	sys     *actor.ActorSystem
	store   *memStore
	holds   *countingHolds
	notices *notices
	deps    *RequestDeps
}

func newRequestRig(t *testing.T) *requestRig {
	r := &requestRig{
		sys: actor.NewActorSystem(), store: newMemStore(),
		holds:   &countingHolds{renews: map[string]int{}, releases: map[string]int{}},
		notices: &notices{got: map[string][]proto.Message{}},
	}
	r.deps = &RequestDeps{Store: r.store, Holds: r.holds, Self: "m1", Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Publish: r.notices.publish, Table: NewRequestTable(), StoreTimeout: 30 * time.Second}
	t.Cleanup(r.sys.Shutdown)
	return r
}

func startMsg(id, engine, transfer string) *messages.StartRequestMsg {
	return &messages.StartRequestMsg{RequestId: id, EngineId: engine, PromptTokenIds: []uint32{1, 2, 3},
		Params: &messages.KVTransferParams{TransferId: transfer, RetainS: 60, RemoteCtrl: &messages.RemoteCtrl{Member: "p1"}}}
}

// ask sends msg to pid and waits up to timeout for its RequestReply.
func (r *requestRig) ask(t *testing.T, pid *actor.PID, msg any, timeout time.Duration) (*messages.RequestStatus, error) {
	t.Helper()
	res, err := r.sys.Root.RequestFuture(pid, msg, timeout).Result()
	if err != nil {
		return nil, err
	}
	rep := res.(RequestReply)
	return rep.Status, rep.Err
}

func (r *requestRig) start(t *testing.T, id, engine, transfer string) *actor.PID {
	t.Helper()
	pid := r.sys.Root.Spawn(RequestProps(r.deps))
	st, err := r.ask(t, pid, &StartRequest{Msg: startMsg(id, engine, transfer)}, 5*time.Second)
	if err != nil || st.GetStatus() != "running" {
		t.Fatalf("start %s: %v %v", id, st, err)
	}
	return pid
}

// TestSlowStoreWriteDoesNotDelayOtherMessages: while a request's
// checkpoint write hangs in JetStream, its actor still answers Inspect at
// once and takes other messages; the calls that need the store wait their
// turn, in order, and are answered when the write returns.
func TestSlowStoreWriteDoesNotDelayOtherMessages(t *testing.T) {
	r := newRequestRig(t)
	pid := r.start(t, "r1", "e1", "t1")
	gate := make(chan struct{})
	r.store.mu.Lock()
	r.store.gate = gate
	r.store.mu.Unlock()

	first := r.sys.Root.RequestFuture(pid, &RequestProgress{Epoch: 1, Tokens: []uint32{7}}, 30*time.Second)
	second := r.sys.Root.RequestFuture(pid, &RequestProgress{Epoch: 1, Tokens: []uint32{8}}, 30*time.Second)
	waitpoll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n := r.store.waitingAtGate(); n != 1 {
			return fmt.Errorf("%d writes at the gate, want 1", n)
		}
		return nil
	})
	// Another engine went away: no answer, but it must not queue ahead of
	// the inspection.
	r.sys.Root.Send(pid, &EngineLost{Engine: "e9"})
	st, err := r.ask(t, pid, &InspectRequest{}, time.Second)
	if err != nil {
		t.Fatalf("inspect while a write hangs: %v (the mailbox waits for the store)", err)
	}
	if got := len(st.GetState().GetGeneratedTokenIds()); st.GetStatus() != "running" || got != 0 {
		t.Fatalf("inspect while a write hangs: status %q with %d generated tokens, want running with 0", st.GetStatus(), got)
	}
	if r.store.waitingAtGate() != 1 {
		t.Fatal("the write returned before the inspection was answered: the test proves nothing")
	}
	close(gate)
	for i, f := range []*actor.Future{first, second} {
		res, err := f.Result()
		if err != nil {
			t.Fatalf("progress %d: %v", i+1, err)
		}
		rep := res.(RequestReply)
		// Answered with the state's summary: the count, not the ids.
		if st := rep.Status.GetState(); rep.Err != nil || st.GetGeneratedLen() != uint32(i+1) || len(st.GetGeneratedTokenIds()) != 0 {
			t.Fatalf("progress %d: %v, generated_len %d and %d ids, want %d and none", i+1, rep.Err, st.GetGeneratedLen(), len(st.GetGeneratedTokenIds()), i+1)
		}
	}
	stored, _, err := r.store.Get(context.Background(), "r1")
	if err != nil || fmt.Sprint(stored.GeneratedTokenIds) != "[7 8]" {
		t.Fatalf("stored tokens %v (%v), want [7 8] in order", stored.GetGeneratedTokenIds(), err)
	}
}

// TestFinishReleasesTheHoldOnce: a finished request deletes its state,
// releases its hold once, leaves the table, and later calls find nobody.
func TestFinishReleasesTheHoldOnce(t *testing.T) {
	r := newRequestRig(t)
	pid := r.start(t, "r1", "e1", "t1")
	waitpoll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n, _ := r.holds.counts("t1"); n != 1 {
			return fmt.Errorf("%d renewals after the start, want 1 (the binding one)", n)
		}
		return nil
	})
	if _, err := r.ask(t, pid, &FinishRequest{Epoch: 2}, 5*time.Second); err == nil {
		t.Fatal("finish at a stale epoch was accepted")
	}
	st, err := r.ask(t, pid, &FinishRequest{Epoch: 1}, 5*time.Second)
	if err != nil || st.GetStatus() != "finished" {
		t.Fatalf("finish: %v %v", st, err)
	}
	if _, releases := r.holds.counts("t1"); releases != 1 {
		t.Fatalf("%d releases after the finish answered, want 1", releases)
	}
	if _, _, err := r.store.Get(context.Background(), "r1"); err == nil {
		t.Fatal("the finished request is still stored")
	}
	// The slot is free once the finish is answered: a caller at the
	// member's requests_max starts its next request at once.
	if _, ok := r.deps.Table.Lookup("r1"); ok || r.deps.Table.Len() != 0 {
		t.Fatalf("the finished request is still in the table (%d live) after the finish answered", r.deps.Table.Len())
	}
}

// TestFencedWriteTellsTheEngine: another activation wrote the request (an
// adoption elsewhere): the next checkpoint is refused with the fenced
// error, the engine gets a fenced notice naming the new owner, the actor
// stops, and the hold is not released.
func TestFencedWriteTellsTheEngine(t *testing.T) {
	r := newRequestRig(t)
	pid := r.start(t, "r1", "e1", "t1")
	cur, rev, err := r.store.Get(context.Background(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	adopted, err := requests.Adopt(cur, "m1", "m2", "e2", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.store.Update(context.Background(), adopted, rev, requests.PromptChanged(cur, adopted)); err != nil {
		t.Fatal(err)
	}
	_, err = r.ask(t, pid, &RequestProgress{Epoch: 1, Tokens: []uint32{7}}, 5*time.Second)
	if !errors.Is(err, requests.ErrFenced) {
		t.Fatalf("progress after an adoption elsewhere: %v, want fenced", err)
	}
	waitpoll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		got := r.notices.on(api.FencedSubject("m1", "e1"))
		if len(got) != 1 || got[0].(*messages.FencedNotice).GetNewOwner() != "m2" {
			return fmt.Errorf("fenced notices to e1: %v, want one naming m2", got)
		}
		return nil
	})
	if _, releases := r.holds.counts("t1"); releases != 0 {
		t.Fatalf("a fenced activation released the hold %d times", releases)
	}
}

// TestHoldLostIsToldOnce: a new request whose hold its first renewal finds
// gone (a start naming no hold) is told once, never renewed or released
// again, and keeps no record: the request store holds nothing of it and
// its actor stops. (A hold lost after it was alive leaves the request
// running to its finish: testdata/hold_lost.txt of requests/activation.)
func TestHoldLostIsToldOnce(t *testing.T) {
	r := newRequestRig(t)
	r.holds.gone = true
	pid := r.start(t, "r1", "e1", "t1")
	waitpoll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n := len(r.notices.on(api.HoldLostSubject("m1", "e1"))); n != 1 {
			return fmt.Errorf("%d hold.lost notices, want 1", n)
		}
		if _, _, err := r.store.Get(context.Background(), "r1"); !errors.Is(err, requests.ErrNotFound) {
			return fmt.Errorf("the record of a request without a hold: %v, want not found", err)
		}
		return nil
	})
	if st, err := r.ask(t, pid, &FinishRequest{Epoch: 1}, time.Second); err == nil {
		t.Fatalf("finish of a request that ended without its hold: %v, want an error", st)
	}
	if renews, releases := r.holds.counts("t1"); releases != 0 || renews != 0 {
		t.Fatalf("a hold that did not exist was renewed %d times and released %d times, want neither", renews, releases)
	}
}

// TestTakeoverWritesTheRecordOnly: a router's resume landing on another
// member (request.start with takeover) and the progress after it store the
// record alone: the same bytes at 1k and 8k prompt tokens, where the whole
// state is tens of KB. The stored request still reads back whole.
func TestTakeoverWritesTheRecordOnly(t *testing.T) {
	written := map[int][2]int{}
	for _, n := range []int{1024, 8192} {
		r := newRequestRig(t)
		first := startMsg("r1", "e1", "t1")
		first.PromptTokenIds = make([]uint32, n)
		for i := range first.PromptTokenIds {
			first.PromptTokenIds[i] = uint32(100_000 + i)
		}
		first.ResumeAuthority = requests.AuthorityRouter
		if st, err := r.ask(t, r.sys.Root.Spawn(RequestProps(r.deps)), &StartRequest{Msg: first}, 5*time.Second); err != nil || st.GetState().GetEpoch() != 1 {
			t.Fatalf("start: %v %v", st, err)
		}
		// The engine on the other member resends the prompt and the 3
		// tokens generated so far.
		other := *r.deps
		other.Self, other.Table = "m2", NewRequestTable()
		resume := proto.CloneOf(first)
		resume.EngineId, resume.Takeover = "e2", true
		resume.PromptTokenIds = append(resume.PromptTokenIds, 7, 8, 9)
		pid := r.sys.Root.Spawn(RequestProps(&other))
		st, err := r.ask(t, pid, &StartRequest{Msg: resume}, 5*time.Second)
		if err != nil || st.GetState().GetEpoch() != 2 || st.GetState().GetOwner() != "m2" || fmt.Sprint(st.GetState().GetGeneratedTokenIds()) != "[7 8 9]" {
			t.Fatalf("takeover at %d prompt tokens: %v %v", n, st, err)
		}
		takeover := r.store.lastWrite()
		if _, err := r.ask(t, pid, &RequestProgress{Epoch: 2, Tokens: []uint32{10}}, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		written[n] = [2]int{takeover, r.store.lastWrite()}
		if takeover > 512 || r.store.lastWrite() > 512 {
			t.Fatalf("at %d prompt tokens the takeover stored %d bytes and the progress after it %d: want the record alone (<= 512)", n, takeover, r.store.lastWrite())
		}
		got, _, err := r.store.Get(context.Background(), "r1")
		if err != nil || !slices.Equal(got.PromptTokenIds, first.PromptTokenIds) || fmt.Sprint(got.GeneratedTokenIds) != "[7 8 9 10]" {
			t.Fatalf("read back: %d prompt tokens, generated %v, %v", len(got.GetPromptTokenIds()), got.GetGeneratedTokenIds(), err)
		}
	}
	if written[1024] != written[8192] {
		t.Fatalf("bytes stored by the takeover and a progress: %v at 1k prompt tokens, %v at 8k: they grow with the prompt", written[1024], written[8192])
	}
}
