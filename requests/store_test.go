package requests

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
)

// TestKVStoreForgetsFinished pins what made an idle connexd burn a core
// after 78k requests: a finished request must leave nothing in the bucket,
// so the orphan scan reads as many messages after n finished requests as
// before them (it used to read one delete marker per finished request, on
// every scan, each second).
func TestKVStoreForgetsFinished(t *testing.T) {
	nc := natsConn(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := OpenKVStore(ctx, nc, 1, time.Hour, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	run := func(id string) *messages.StartRequestMsg {
		m := start()
		m.RequestId = id
		return m
	}
	live, _ := New(run("live"), "d1", time.Now())
	if _, err := s.Create(ctx, live); err != nil {
		t.Fatal(err)
	}
	// scan is one orphan scan: what it returns and how many messages
	// reached this connection (the store's only user) while it ran.
	scan := func() (map[string]string, uint64) {
		t.Helper()
		before := nc.Stats().InMsgs
		owners, err := s.Owners(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return owners, nc.Stats().InMsgs - before
	}
	_, base := scan()

	const n = 300
	for i := range n {
		st, _ := New(run(fmt.Sprintf("done-%d", i)), "d1", time.Now())
		rev, err := s.Create(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		next, _ := Append(st, st.Epoch, []uint32{7}, time.Now())
		if rev, err = s.Update(ctx, next, rev, PromptChanged(st, next)); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, st.RequestId, rev); err != nil {
			t.Fatal(err)
		}
	}
	owners, read := scan()
	if len(owners) != 1 || owners["live"] != "d1" {
		t.Fatalf("owners after %d finished requests: %v, want only the live one", n, owners)
	}
	// A few messages of slack for the consumer's own traffic; a replay of
	// the finished requests is n more.
	if read > base+3 {
		t.Fatalf("the orphan scan read %d messages after %d finished requests, %d before them: it replays what is over", read, n, base)
	}
	info, err := s.KV.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.Values(); got != 2 {
		t.Fatalf("the bucket holds %d messages after %d finished requests and one live one, want 2 (its record and its prompt)", got, n)
	}

	// The fence still holds: a delete at a stale revision is refused and
	// leaves the request; an id used again after its finish starts afresh.
	rev, err := s.Create(ctx, live)
	if !errors.Is(err, ErrExists) {
		t.Fatalf("create over a live request: %v", err)
	}
	_, rev, err = s.Get(ctx, "live")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "live", rev-1); !errors.Is(err, ErrFenced) {
		t.Fatalf("delete at a stale revision: %v, want ErrFenced", err)
	}
	if _, _, err := s.Get(ctx, "live"); err != nil {
		t.Fatalf("a refused delete removed the request: %v", err)
	}
	again, _ := New(run("done-0"), "d2", time.Now())
	if _, err := s.Create(ctx, again); err != nil {
		t.Fatalf("an id used again after its request finished: %v", err)
	}
	if got, _, err := s.Get(ctx, "done-0"); err != nil || got.Owner != "d2" {
		t.Fatalf("the request created again: %v %v", got, err)
	}
}

// oldRecord stores st as a connexd before the prompt split did: the whole
// state under its key, no prompt key.
func oldRecord(t testing.TB, ctx context.Context, s *KVStore, st *messages.RequestState) uint64 {
	t.Helper()
	old := proto.CloneOf(st)
	old.PromptLen, old.PromptDigest, old.PromptKey = 0, nil, ""
	data, err := proto.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := s.KV.Create(ctx, Key(st.RequestId), data)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// TestPurgeMarkers: the delete markers a connexd before Delete purged
// them left (a bare KV delete) go in one sweep, and nothing live with
// them; a scan then reads as little as in a bucket that never held them.
func TestPurgeMarkers(t *testing.T) {
	nc := natsConn(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := OpenKVStore(ctx, nc, 1, time.Hour, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		m := start()
		m.RequestId = fmt.Sprintf("r%d", i)
		st, _ := New(m, "d1", time.Now())
		rev := oldRecord(t, ctx, s, st)
		if i%10 == 0 { // still running
			continue
		}
		if err := s.KV.Delete(ctx, Key(st.RequestId), jetstream.LastRevision(rev)); err != nil {
			t.Fatal(err)
		}
	}
	values := func() uint64 {
		t.Helper()
		info, err := s.KV.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.Values()
	}
	if got := values(); got != 50 {
		t.Fatalf("%d messages before the sweep, want 5 live requests and 45 markers", got)
	}
	n, err := s.PurgeMarkers(ctx)
	if err != nil || n != 45 {
		t.Fatalf("PurgeMarkers: %d, %v; want 45", n, err)
	}
	if got := values(); got != 5 {
		t.Fatalf("%d messages after the sweep, want the 5 live requests", got)
	}
	owners, err := s.Owners(ctx)
	if err != nil || len(owners) != 5 {
		t.Fatalf("owners after the sweep: %v %v", owners, err)
	}
	if n, err := s.PurgeMarkers(ctx); err != nil || n != 0 {
		t.Fatalf("a second sweep: %d, %v; want none", n, err)
	}
}

// TestPurgeMarkersTakesStrayPrompts: a Delete cut between its marker and
// its purges (a crash, a store timeout) left the finished request's prompt,
// up to megabytes held against request_store_bytes until request_ttl_s.
// The sweep takes such a prompt once it is strayAfter old, and never the
// prompt of a live request, nor a young one (a creation writes its prompt
// a moment before its record).
func TestPurgeMarkersTakesStrayPrompts(t *testing.T) {
	s, _, ctx := openStore(t, 60*time.Second)
	mk := func(id string) *messages.RequestState {
		m := start()
		m.RequestId = id
		st, _ := New(m, "d1", time.Now())
		return st
	}
	live := mk("live")
	if _, err := s.Create(ctx, live); err != nil {
		t.Fatal(err)
	}
	// "cut": the marker written, the purges never ran (as Delete's first
	// step alone).
	cut := mk("cut")
	rev, err := s.Create(ctx, cut)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.KV.Delete(ctx, Key(cut.RequestId), jetstream.LastRevision(rev)); err != nil {
		t.Fatal(err)
	}
	// "starting": its prompt written, its record not yet.
	starting := mk("starting")
	if _, err := s.putPrompt(ctx, starting); err != nil {
		t.Fatal(err)
	}
	s.strayAfter = time.Hour // all of them young: only the marker goes
	if n, err := s.PurgeMarkers(ctx); err != nil || n != 1 {
		t.Fatalf("sweep with young prompts: %d, %v; want the marker alone", n, err)
	}
	s.strayAfter = 0 // all old: the stray prompts go too
	if n, err := s.PurgeMarkers(ctx); err != nil || n != 2 {
		t.Fatalf("sweep with old prompts: %d, %v; want the prompts of cut and starting", n, err)
	}
	if got, _, err := s.Get(ctx, live.RequestId); err != nil || fmt.Sprint(got.PromptTokenIds) != fmt.Sprint(live.PromptTokenIds) {
		t.Fatalf("the live request after the sweeps: %v, %v", got, err)
	}
	info, err := s.KV.Status(ctx)
	if err != nil || info.Values() != 2 {
		t.Fatalf("%d messages after the sweeps (%v), want the live request's record and prompt", info.Values(), err)
	}
}

// TestLongRequestKeepsItsPrompt: the bucket's age limit (request_ttl_s)
// counts from each key's own last write, and a running request rewrites
// only its record. Its prompt is stored again once it is a tenth of the
// TTL old (PromptDue), so a request that runs for several TTLs can still
// be read whole, as an adoption reads it. With PromptChanged alone (the
// prompt written once, at the start) the prompt expired under the live
// record and Get failed with "prompt of req-1: no such request".
func TestLongRequestKeepsItsPrompt(t *testing.T) {
	nc := natsConn(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const ttl = 2 * time.Second
	s, err := OpenKVStore(ctx, nc, 1, ttl, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	refresh := ttl / PromptRefreshDiv
	st, _ := New(start(), "d1", time.Now())
	if !PromptDue(nil, st, refresh) {
		t.Fatal("a new request's prompt is not due")
	}
	rev, err := s.Create(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	// Progress every 100 ms for three TTLs: the request's own pace.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	writes, prompts := 0, 0
	for end := time.Now().Add(3 * ttl); time.Now().Before(end); writes++ {
		<-tick.C
		next, err := Append(st, st.Epoch, []uint32{uint32(writes)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		due := PromptDue(st, next, refresh)
		if due {
			prompts++
		}
		if rev, err = s.Update(ctx, next, rev, due); err != nil {
			t.Fatal(err)
		}
		st = next
	}
	got, _, err := s.Get(ctx, st.RequestId)
	if err != nil {
		t.Fatalf("a live request running for three TTLs cannot be read whole: %v", err)
	}
	if fmt.Sprint(got.PromptTokenIds) != fmt.Sprint(st.PromptTokenIds) || len(got.GeneratedTokenIds) != writes {
		t.Fatalf("read back prompt %v and %d generated tokens, want %v and %d", got.PromptTokenIds, len(got.GeneratedTokenIds), st.PromptTokenIds, writes)
	}
	if prompts == 0 || prompts >= writes {
		t.Fatalf("the prompt was stored again at %d of %d writes; want some, not every one", prompts, writes)
	}
}

// TestRefusedCreateTakesItsPromptBack: a request.start on the id of a live
// request is refused (ErrExists); its prompt, written first, goes again,
// so that repeated refused starts cannot pile prompts up (bypassing
// requests_max) until the live request finishes. A refused start of the
// same prompt leaves the live request's prompt alone (the same key).
func TestRefusedCreateTakesItsPromptBack(t *testing.T) {
	s, _, ctx := openStore(t, 60*time.Second)
	live, _ := New(start(), "d1", time.Now())
	if _, err := s.Create(ctx, live); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		m := start()
		m.PromptTokenIds = []uint32{uint32(100 + i), 2, 3, 4}
		other, _ := New(m, "d2", time.Now())
		if _, err := s.Create(ctx, other); !errors.Is(err, ErrExists) {
			t.Fatalf("create over a live id: %v, want ErrExists", err)
		}
	}
	same, _ := New(start(), "d2", time.Now())
	if _, err := s.Create(ctx, same); !errors.Is(err, ErrExists) {
		t.Fatalf("create of the same prompt over a live id: %v, want ErrExists", err)
	}
	info, err := s.KV.Status(ctx)
	if err != nil || info.Values() != 2 {
		t.Fatalf("%d messages after 21 refused creations (%v), want the live request's record and prompt", info.Values(), err)
	}
	if got, _, err := s.Get(ctx, live.RequestId); err != nil || fmt.Sprint(got.PromptTokenIds) != fmt.Sprint(live.PromptTokenIds) {
		t.Fatalf("the live request after the refused creations: %v, %v", got, err)
	}
}
