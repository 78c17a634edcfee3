package requests

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

func TestPlace(t *testing.T) {
	cases := []struct {
		name    string
		orphans []string
		cands   []Candidate
		want    map[string]string
	}{
		{"none", []string{"a"}, nil, map[string]string{}},
		{"least loaded", []string{"a"}, []Candidate{{"m1", 5}, {"m2", 1}}, map[string]string{"a": "m2"}},
		{"spread", []string{"c", "a", "b"}, []Candidate{{"m1", 0}, {"m2", 1}}, map[string]string{"a": "m1", "b": "m1", "c": "m2"}},
		{"tie by id", []string{"a"}, []Candidate{{"m9", 2}, {"m3", 2}}, map[string]string{"a": "m3"}},
	}
	for _, c := range cases {
		if got := Place(c.orphans, c.cands); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %v want %v", c.name, got, c.want)
		}
	}
}

func TestViewOrphans(t *testing.T) {
	owners := map[string]string{"r1": "live", "r2": "left", "r3": "unheard"}
	fresh := View{Present: map[string]bool{"live": true}, Departed: map[string]bool{"left": true}, Watched: 100 * time.Millisecond, Grace: time.Second}
	if got := OrphansIn(owners, fresh); !reflect.DeepEqual(got, []string{"r2"}) {
		t.Fatalf("a freshly joined member may only move requests of members it saw leave: %v", got)
	}
	settled := fresh
	settled.Watched = 2 * time.Second
	if got := OrphansIn(owners, settled); !reflect.DeepEqual(got, []string{"r2", "r3"}) {
		t.Fatalf("after the grace an unheard-of owner is orphaned: %v", got)
	}
	back := settled
	back.Present = map[string]bool{"live": true, "left": true}
	if got := OrphansIn(owners, back); !reflect.DeepEqual(got, []string{"r3"}) {
		t.Fatalf("a member present again owns its requests: %v", got)
	}
}

func TestCoordinatorIsSettled(t *testing.T) {
	cands := []Candidate{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	if got := CoordinatorIn(cands, View{Settled: map[string]bool{"b": true, "c": true}}); got != "b" {
		t.Fatalf("a just joined (or came back from a pause): b must coordinate, got %q", got)
	}
	if got := CoordinatorIn(cands, View{}); got != "" {
		t.Fatalf("nobody settled: nobody coordinates, got %q", got)
	}
}

func start() *messages.StartRequestMsg {
	return &messages.StartRequestMsg{RequestId: "req-1", EngineId: "e1", PromptTokenIds: []uint32{1, 2, 3, 4},
		Params: &messages.KVTransferParams{TransferId: "t", RemoteNumTokens: 4}}
}

func TestStateTransitions(t *testing.T) {
	now := time.Unix(100, 0)
	st, err := New(start(), "d1", now)
	if err != nil || st.Epoch != 1 || st.Owner != "d1" {
		t.Fatalf("new: %v %v", st, err)
	}
	bad := start()
	bad.Params.RemoteNumTokens = 9
	if _, err := New(bad, "d1", now); !errors.Is(err, ErrInvalid) {
		t.Fatalf("remote_num_tokens > prompt: %v", err)
	}
	st2, err := Append(st, 1, []uint32{7, 8}, now)
	if err != nil || len(st2.GeneratedTokenIds) != 2 || len(st.GeneratedTokenIds) != 0 {
		t.Fatalf("append: %v %v (input must not change)", st2, err)
	}
	st3, err := Adopt(st2, "d1", "d2", "e2", now)
	if err != nil || st3.Epoch != 2 || st3.Owner != "d2" || !reflect.DeepEqual(st3.PreviousOwners, []string{"d1"}) {
		t.Fatalf("adopt: %v %v", st3, err)
	}
	if _, err := Adopt(st3, "d1", "d3", "e3", now); !errors.Is(err, ErrNotOrphan) {
		t.Fatalf("second adopt of the same orphan: %v", err)
	}
	if _, err := Append(st3, 1, []uint32{9}, now); !errors.Is(err, ErrFenced) {
		t.Fatalf("stale epoch: %v", err)
	}
	all, loaded := ResumeTokens(st3)
	if !reflect.DeepEqual(all, []uint32{1, 2, 3, 4, 7, 8}) || loaded != 4 {
		t.Fatalf("resume tokens %v loaded %d", all, loaded)
	}
}

// natsConn starts an in-process NATS server (with JetStream or not) for
// the test and connects to it.
func natsConn(t testing.TB, jetstream bool) *nats.Conn {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: jetstream, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("not ready")
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func TestKVStoreFencing(t *testing.T) {
	nc := natsConn(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := OpenKVStore(ctx, nc, 1, time.Hour, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := New(start(), "d1", time.Now())
	rev, err := s.Create(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, "never-created"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get of a request never created: %v", err)
	}
	if _, err := s.Create(ctx, st); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate create: %v", err)
	}
	// The new owner adopts with compare-and-set...
	adopted, _ := Adopt(st, "d1", "d2", "e2", time.Now())
	rev2, err := s.Update(ctx, adopted, rev, PromptChanged(st, adopted))
	if err != nil {
		t.Fatal(err)
	}
	// ...and the zombie's write at the old revision is fenced.
	zombie, _ := Append(st, 1, []uint32{5}, time.Now())
	if _, err := s.Update(ctx, zombie, rev, false); !errors.Is(err, ErrFenced) {
		t.Fatalf("zombie write: want ErrFenced, got %v", err)
	}
	got, grev, err := s.Get(ctx, "req-1")
	if err != nil || grev != rev2 || got.Owner != "d2" || got.Epoch != 2 || len(got.GeneratedTokenIds) != 0 {
		t.Fatalf("after fencing: %v rev %d %v", got, grev, err)
	}
	owners, err := s.Owners(ctx)
	if err != nil || owners["req-1"] != "d2" {
		t.Fatalf("owners %v %v", owners, err)
	}
	if err := s.Delete(ctx, "req-1", rev); err == nil {
		t.Fatal("delete at a stale revision must fail")
	}
	if err := s.Delete(ctx, "req-1", rev2); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get(ctx, "req-1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	owners, err = s.Owners(ctx)
	if err != nil || len(owners) != 0 {
		t.Fatalf("owners after delete %v %v", owners, err)
	}

	// request_ttl_s: reopened with a 1 s TTL, an entry nobody writes again
	// is gone within a few seconds.
	s, err = OpenKVStore(ctx, nc, 1, time.Second, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, st); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 8*time.Second, 100*time.Millisecond, func() error {
		if _, _, err := s.Get(ctx, "req-1"); !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("entry still there after its last write with a 1 s TTL: %v", err)
		}
		return nil
	})
}

func TestTakeover(t *testing.T) {
	now := time.Unix(100, 0)
	first := start()
	first.ResumeAuthority = AuthorityRouter
	st, err := New(first, "d1", now)
	if err != nil {
		t.Fatal(err)
	}
	st, _ = Append(st, 1, []uint32{7, 8}, now)
	resume := &messages.StartRequestMsg{RequestId: "req-1", EngineId: "e2", PromptTokenIds: []uint32{1, 2, 3, 4, 7, 8},
		Params: st.Params, Takeover: true}
	next, err := Takeover(st, resume, "d2", now)
	if err != nil {
		t.Fatal(err)
	}
	// The resent tokens start with the prompt: the stored prompt stays, the
	// rest are the tokens generated so far.
	if next.Epoch != 2 || next.Owner != "d2" || next.EngineId != "e2" || !reflect.DeepEqual(next.PreviousOwners, []string{"d1"}) ||
		next.ResumeAuthority != AuthorityRouter || !reflect.DeepEqual(next.PromptTokenIds, []uint32{1, 2, 3, 4}) ||
		!reflect.DeepEqual(next.GeneratedTokenIds, []uint32{7, 8}) || next.PromptLen != 4 || PromptChanged(st, next) {
		t.Fatalf("takeover: %v", next)
	}
	// From the record alone (Head: no token or block ids), the same.
	head, _ := SplitState(st)
	if fromHead, err := Takeover(head, resume, "d2", now); err != nil || PromptChanged(head, fromHead) ||
		!reflect.DeepEqual(fromHead.GeneratedTokenIds, []uint32{7, 8}) || fromHead.PromptKey != st.PromptKey {
		t.Fatalf("takeover from the record: %v %v", fromHead, err)
	}
	// Tokens that do not start with the prompt, or other hold blocks,
	// become a new prompt, stored with the takeover.
	for name, m := range map[string]*messages.StartRequestMsg{
		"other tokens": {RequestId: "req-1", EngineId: "e2", PromptTokenIds: []uint32{1, 2, 3, 5, 7, 8}, Params: st.Params, Takeover: true},
		"fewer tokens": {RequestId: "req-1", EngineId: "e2", PromptTokenIds: []uint32{1, 2, 3}, Params: &messages.KVTransferParams{TransferId: "t", RemoteNumTokens: 3}, Takeover: true},
		"other blocks": {RequestId: "req-1", EngineId: "e2", PromptTokenIds: []uint32{1, 2, 3, 4, 7, 8}, Params: &messages.KVTransferParams{TransferId: "t", RemoteNumTokens: 4, RemoteBlockIds: []uint32{9}}, Takeover: true},
	} {
		moved, err := Takeover(head, m, "d2", now)
		if err != nil || !PromptChanged(head, moved) || !reflect.DeepEqual(moved.PromptTokenIds, m.PromptTokenIds) || len(moved.GeneratedTokenIds) != 0 {
			t.Fatalf("%s: takeover %v %v: want the resent tokens as a new prompt", name, moved, err)
		}
	}
	if _, err := Append(st, 1, []uint32{9}, now); err != nil {
		t.Fatalf("the old state itself must not change: %v", err)
	}
	if _, err := Append(next, 1, []uint32{9}, now); !errors.Is(err, ErrFenced) {
		t.Fatalf("the old epoch after a takeover: %v", err)
	}
	other := &messages.StartRequestMsg{RequestId: "req-1", EngineId: "e3", PromptTokenIds: []uint32{1, 2, 3, 4},
		Params: &messages.KVTransferParams{TransferId: "another", RemoteNumTokens: 4}, Takeover: true}
	if _, err := Takeover(next, other, "d3", now); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a takeover naming another transfer: %v", err)
	}
	bad := start()
	bad.ResumeAuthority = "somebody"
	if _, err := New(bad, "d1", now); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown resume_authority: %v", err)
	}
}

// TestOpenKVStoreUnrecoverable: what waiting cannot cure is told apart, so
// connexd stops retrying at once (a single server asked for replicas, or no
// JetStream at all).
func TestOpenKVStoreUnrecoverable(t *testing.T) {
	for _, tc := range []struct {
		name      string
		jetstream bool
		replicas  int
	}{{"replicas on a single server", true, 3}, {"no JetStream", false, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			nc := natsConn(t, tc.jetstream)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := OpenKVStore(ctx, nc, tc.replicas, time.Hour, 1<<20)
			if err == nil || !Unrecoverable(err) {
				t.Fatalf("OpenKVStore: %v; Unrecoverable: %v", err, Unrecoverable(err))
			}
		})
	}
	if Unrecoverable(errors.New("nats: timeout")) {
		t.Fatal("a timeout is not unrecoverable")
	}
}

// TestMaxTokensBoundsProgress: request.progress past the request's own
// max_tokens is refused, and a takeover's max_tokens (what is left) counts
// the tokens generated before it.
func TestMaxTokensBoundsProgress(t *testing.T) {
	now := time.Unix(100, 0)
	m := start()
	m.MaxTokens = 3
	st, err := New(m, "d1", now)
	if err != nil {
		t.Fatal(err)
	}
	if st, err = Append(st, 1, []uint32{7, 8}, now); err != nil {
		t.Fatal(err)
	}
	if _, err := Append(st, 1, []uint32{9, 10}, now); !errors.Is(err, ErrInvalid) {
		t.Fatalf("the 4th token of a max_tokens=3 request: %v", err)
	}
	head, _ := SplitState(st)
	if head.MaxTokens != 3 {
		t.Fatalf("the record keeps max_tokens: %d", head.MaxTokens)
	}
	resume := &messages.StartRequestMsg{RequestId: "req-1", EngineId: "e2", PromptTokenIds: []uint32{1, 2, 3, 4, 7, 8},
		Params: st.Params, Takeover: true, MaxTokens: 1}
	next, err := Takeover(head, resume, "d2", now)
	if err != nil || next.MaxTokens != 3 {
		t.Fatalf("takeover with 1 token left of 3: max_tokens %d, %v", next.GetMaxTokens(), err)
	}
	if next, err = Append(next, 2, []uint32{9}, now); err != nil {
		t.Fatalf("the last token: %v", err)
	}
	if _, err := Append(next, 2, []uint32{10}, now); !errors.Is(err, ErrInvalid) {
		t.Fatalf("past max_tokens after a takeover: %v", err)
	}
	m.MaxTokens = MaxGenerated + 1
	if st, err := New(m, "d1", now); err != nil || st.MaxTokens != MaxGenerated {
		t.Fatalf("max_tokens past MaxGenerated: %v %v", st.GetMaxTokens(), err)
	}
}
