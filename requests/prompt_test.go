package requests

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// countingKV counts the value bytes written through the bucket.
type countingKV struct {
	jetstream.KeyValue
	bytes int
}

func (c *countingKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	c.bytes += len(value)
	return c.KeyValue.Put(ctx, key, value)
}

func (c *countingKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	c.bytes += len(value)
	return c.KeyValue.Create(ctx, key, value, opts...)
}

func (c *countingKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	c.bytes += len(value)
	return c.KeyValue.Update(ctx, key, value, rev)
}

// longStart is a request of n prompt tokens (ids of a large vocabulary, 3
// bytes each encoded) over a hold of one block per 16 of them.
func longStart(id string, n int) *messages.StartRequestMsg {
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(100_000 + i%50_000)
	}
	blocks := make([]uint32, (n+15)/16)
	for i := range blocks {
		blocks[i] = uint32(70_000 + i)
	}
	return &messages.StartRequestMsg{RequestId: id, EngineId: "e1", PromptTokenIds: toks, ResumeAuthority: AuthorityRouter,
		Params: &messages.KVTransferParams{TransferId: "0123456789abcdef0123456789abcdef", RemoteNumTokens: uint32(n), RemoteBlockIds: blocks,
			RetainS: 60, BlockSize: 16, RemoteCtrl: &messages.RemoteCtrl{Member: "p1"}}}
}

// resumeOf is the router's resume of start after generated: the prompt
// followed by the tokens generated so far, the same params.
func resumeOf(start *messages.StartRequestMsg, generated []uint32) *messages.StartRequestMsg {
	m := proto.CloneOf(start)
	m.PromptTokenIds = append(slices.Clone(start.PromptTokenIds), generated...)
	m.EngineId, m.Takeover = "e2", true
	m.Params.ConnexResume = true
	return m
}

// openStore opens the request bucket on an embedded JetStream of its own,
// with a context of timeout.
func openStore(tb testing.TB, timeout time.Duration) (*KVStore, *nats.Conn, context.Context) {
	tb.Helper()
	nc := natsConn(tb, true)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	tb.Cleanup(cancel)
	s, err := OpenKVStore(ctx, nc, 1, time.Hour, 1<<30)
	if err != nil {
		tb.Fatal(err)
	}
	return s, nc, ctx
}

// TestTakeoverWriteIsBounded pins the cost of a takeover: it reads the
// record and writes it back, and neither grows with the prompt (it used to
// write all prompt token ids back, 8k prompt tokens ~ 25 KB). The stored
// request still reads back whole, and a finish leaves nothing behind.
func TestTakeoverWriteIsBounded(t *testing.T) {
	s, _, ctx := openStore(t, 30*time.Second)
	kv := &countingKV{KeyValue: s.KV}
	s.KV = kv
	written := map[int]int{}
	generated := []uint32{11, 12, 13, 14, 15, 16, 17, 18}
	for _, n := range []int{1024, 8192} {
		id := fmt.Sprintf("long-%d", n)
		m := longStart(id, n)
		st, err := New(m, "d1", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Create(ctx, st); err != nil {
			t.Fatal(err)
		}
		head, rev, err := s.Head(ctx, id)
		if err != nil || len(head.PromptTokenIds) != 0 || len(head.GetParams().GetRemoteBlockIds()) != 0 || head.PromptLen != uint32(n) {
			t.Fatalf("head of %s: %d tokens, %d blocks, prompt_len %d, %v: want the record only", id, len(head.GetPromptTokenIds()),
				len(head.GetParams().GetRemoteBlockIds()), head.GetPromptLen(), err)
		}
		next, err := Takeover(head, resumeOf(m, generated), "d2", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		prompt := PromptChanged(head, next)
		kv.bytes = 0
		rev, err = s.Update(ctx, next, rev, prompt)
		if err != nil {
			t.Fatal(err)
		}
		written[n] = kv.bytes
		whole, _ := proto.Marshal(next)
		t.Logf("takeover at %d prompt tokens: %d bytes written (the whole state: %d)", n, kv.bytes, len(whole))
		if prompt || kv.bytes > 512 {
			t.Fatalf("takeover at %d prompt tokens wrote %d bytes (prompt stored again: %v), want the record alone (<= 512)", n, kv.bytes, prompt)
		}
		got, grev, err := s.Get(ctx, id)
		if err != nil || grev != rev || !slices.Equal(got.PromptTokenIds, m.PromptTokenIds) || !slices.Equal(got.GeneratedTokenIds, generated) ||
			!slices.Equal(got.Params.RemoteBlockIds, m.Params.RemoteBlockIds) || got.Epoch != 2 || got.Owner != "d2" || got.EngineId != "e2" {
			t.Fatalf("read back after the takeover: rev %d/%d, %d prompt tokens, generated %v, %d blocks, epoch %d owner %s engine %s, %v",
				grev, rev, len(got.GetPromptTokenIds()), got.GetGeneratedTokenIds(), len(got.GetParams().GetRemoteBlockIds()), got.GetEpoch(), got.GetOwner(), got.GetEngineId(), err)
		}
		all, loaded := ResumeTokens(got)
		if !slices.Equal(all, resumeOf(m, generated).PromptTokenIds) || loaded != uint32(n) {
			t.Fatalf("resume tokens after the takeover: %d, loaded %d", len(all), loaded)
		}
		// The old activation's write at its revision is still fenced.
		stale, _ := Append(st, 1, []uint32{9}, time.Now())
		if _, err := s.Update(ctx, stale, 1, false); !errors.Is(err, ErrFenced) {
			t.Fatalf("the fenced owner's write: %v, want ErrFenced", err)
		}
		// A second takeover whose tokens are not the prompt's stores its
		// own prompt; the finish purges both.
		other := resumeOf(m, generated)
		other.PromptTokenIds[0]++
		moved, err := Takeover(next, other, "d3", time.Now())
		if err != nil || !PromptChanged(next, moved) {
			t.Fatalf("a takeover with other tokens: %v (prompt changed: %v)", err, PromptChanged(next, moved))
		}
		if rev, err = s.Update(ctx, moved, rev, true); err != nil {
			t.Fatal(err)
		}
		if got, _, err := s.Get(ctx, id); err != nil || !slices.Equal(got.PromptTokenIds, other.PromptTokenIds) {
			t.Fatalf("the new prompt read back: %v", err)
		}
		if err := s.Delete(ctx, id, rev); err != nil {
			t.Fatal(err)
		}
		info, err := s.KV.Status(ctx)
		if err != nil || info.Values() != 0 {
			t.Fatalf("after the finish the bucket holds %d messages (%v), want none", info.Values(), err)
		}
	}
	if d := written[8192] - written[1024]; d < -2 || d > 2 {
		t.Fatalf("a takeover wrote %d bytes at 1k prompt tokens and %d at 8k: it grows with the prompt", written[1024], written[8192])
	}
}

// TestOldRecords: a record a connexd before the split wrote (the whole
// state, no prompt key) reads back as it was, and its next write stores
// the prompt apart, after which writes carry the record alone.
func TestOldRecords(t *testing.T) {
	s, _, ctx := openStore(t, 30*time.Second)
	m := longStart("old", 1024)
	m.ResumeAuthority = ""
	st, _ := New(m, "d1", time.Now())
	rev := oldRecord(t, ctx, s, st)
	for name, get := range map[string]func(context.Context, string) (*messages.RequestState, uint64, error){"get": s.Get, "head": s.Head} {
		got, grev, err := get(ctx, "old")
		if err != nil || grev != rev || got.PromptKey != "" || !slices.Equal(got.PromptTokenIds, m.PromptTokenIds) || !slices.Equal(got.Params.RemoteBlockIds, m.Params.RemoteBlockIds) {
			t.Fatalf("%s of an old record: %v", name, err)
		}
	}
	if owners, err := s.Owners(ctx); err != nil || owners["old"] != "d1" {
		t.Fatalf("owners with an old record: %v %v", owners, err)
	}
	old, _, _ := s.Get(ctx, "old")
	if adopted, err := Adopt(old, "d1", "d2", "e2", time.Now()); err != nil || !PromptChanged(old, adopted) || adopted.PromptKey == "" {
		t.Fatalf("an adoption of an old record must store its prompt apart: %v", err)
	}
	next, err := Append(old, 1, []uint32{7}, time.Now())
	if err != nil || !PromptChanged(old, next) {
		t.Fatalf("the first write after the upgrade must store the prompt: %v", err)
	}
	if rev, err = s.Update(ctx, next, rev, true); err != nil {
		t.Fatal(err)
	}
	head, _, err := s.Head(ctx, "old")
	if err != nil || head.PromptKey == "" || len(head.PromptTokenIds) != 0 {
		t.Fatalf("after its first write the record has the prompt in it still: %v", err)
	}
	again, err := Append(next, 1, []uint32{8}, time.Now())
	if err != nil || PromptChanged(next, again) {
		t.Fatalf("a second write stores the prompt again: %v", err)
	}
	if rev, err = s.Update(ctx, again, rev, false); err != nil {
		t.Fatal(err)
	}
	got, _, err := s.Get(ctx, "old")
	if err != nil || !slices.Equal(got.PromptTokenIds, m.PromptTokenIds) || !slices.Equal(got.GeneratedTokenIds, []uint32{7, 8}) {
		t.Fatalf("read back after the migration: %v", err)
	}
	if err := s.Delete(ctx, "old", rev); err != nil {
		t.Fatal(err)
	}
	if info, err := s.KV.Status(ctx); err != nil || info.Values() != 0 {
		t.Fatalf("after the finish the bucket holds %d messages (%v), want none", info.Values(), err)
	}
}

// TestSplitStateKeepsEveryField: every field of RequestState is in the
// record but the two that grow with the prompt, which are in the
// RequestPrompt, and a summary's generated_len, which is not stored; a
// field added later that SplitState forgets fails here.
func TestSplitStateKeepsEveryField(t *testing.T) {
	st := &messages.RequestState{}
	fill(st.ProtoReflect())
	rec, prompt := SplitState(st)
	if len(rec.PromptTokenIds) != 0 || len(rec.Params.RemoteBlockIds) != 0 {
		t.Fatalf("the record carries the prompt: %v", rec)
	}
	if !slices.Equal(prompt.TokenIds, st.PromptTokenIds) || !slices.Equal(prompt.RemoteBlockIds, st.Params.RemoteBlockIds) {
		t.Fatalf("the prompt part: %v", prompt)
	}
	if rec.GeneratedLen != 0 {
		t.Fatalf("the record carries a summary's generated_len %d", rec.GeneratedLen)
	}
	want := proto.CloneOf(st)
	want.GeneratedLen = 0 // a summary's count, not stored
	if back := JoinState(rec, prompt); !proto.Equal(back, want) {
		t.Fatalf("split and joined again:\n%v\nwant\n%v", back, want)
	}
}

// fill sets every field of m, nested messages included, to a value that
// is not its zero.
func fill(m protoreflect.Message) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		f := fields.Get(i)
		switch {
		case f.IsList():
			l := m.Mutable(f).List()
			l.Append(value(f))
		case f.Kind() == protoreflect.MessageKind:
			fill(m.Mutable(f).Message())
		default:
			m.Set(f, value(f))
		}
	}
}

func value(f protoreflect.FieldDescriptor) protoreflect.Value {
	switch f.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(string(f.Name()))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte(f.Name()))
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.Uint32Kind:
		return protoreflect.ValueOfUint32(uint32(f.Number()))
	case protoreflect.Uint64Kind:
		return protoreflect.ValueOfUint64(uint64(f.Number()))
	case protoreflect.Int64Kind:
		return protoreflect.ValueOfInt64(int64(f.Number()))
	case protoreflect.Int32Kind:
		return protoreflect.ValueOfInt32(int32(f.Number()))
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(1)
	}
	panic(fmt.Sprintf("fill: field %s of kind %s", f.FullName(), f.Kind()))
}

func TestPromptDue(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	st, err := New(start(), "d1", now)
	if err != nil {
		t.Fatal(err)
	}
	if !PromptDue(nil, st, time.Minute) || st.PromptStoredUnixMs != now.UnixMilli() {
		t.Fatalf("new request: prompt not due or not stamped (%d)", st.PromptStoredUnixMs)
	}
	at := func(d time.Duration) *messages.RequestState {
		next, err := Append(st, st.Epoch, []uint32{9}, now.Add(d))
		if err != nil {
			t.Fatal(err)
		}
		return next
	}
	if next := at(59 * time.Second); PromptDue(st, next, time.Minute) || next.PromptStoredUnixMs != now.UnixMilli() {
		t.Fatalf("a prompt 59 s old with a 1 min refresh is due (stamped %d)", next.PromptStoredUnixMs)
	}
	if next := at(time.Minute); !PromptDue(st, next, time.Minute) || next.PromptStoredUnixMs != now.Add(time.Minute).UnixMilli() {
		t.Fatalf("a prompt 1 min old with a 1 min refresh is not due, or not stamped (%d)", next.PromptStoredUnixMs)
	}
	if next := at(time.Hour); PromptDue(st, next, 0) {
		t.Fatal("refresh 0 stores an unchanged prompt again")
	}
	unknown := proto.Clone(at(time.Second)).(*messages.RequestState)
	unknown.PromptStoredUnixMs = 0
	if !PromptDue(st, unknown, time.Hour) {
		t.Fatal("a record that does not say when its prompt was stored does not store it again")
	}
	// A takeover that keeps the stored prompt keeps its age.
	resume := &messages.StartRequestMsg{RequestId: st.RequestId, EngineId: "e2", Params: st.Params, Takeover: true,
		PromptTokenIds: append(append([]uint32(nil), st.PromptTokenIds...), 9)}
	moved, err := Takeover(st, resume, "d2", now.Add(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if moved.PromptKey != st.PromptKey || moved.PromptStoredUnixMs != st.PromptStoredUnixMs {
		t.Fatalf("takeover kept key %v (want %v) stored at %d (want %d)", moved.PromptKey, st.PromptKey, moved.PromptStoredUnixMs, st.PromptStoredUnixMs)
	}
}
