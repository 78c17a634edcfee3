package requests

import (
	"errors"
	"testing"
	"time"

	"github.com/connex/connex/messages"
)

// TestQuotaBoundsEachEngine: an engine at its request count, its bytes or
// the member's share is refused (ErrQuota) while another engine is
// admitted; ended requests give their room back, and those that stopped
// without an End are forgotten once the engine reaches a limit.
func TestQuotaBoundsEachEngine(t *testing.T) {
	running := map[string]bool{}
	live := func(id string) bool { return running[id] }
	q := &Quota{MaxRequests: 2, MaxBytes: 100 * TokenBytes, MaxMemberBytes: 250 * TokenBytes}
	start := func(id, engine string, tokens int) error {
		err := q.Start(id, engine, tokens, live)
		if err == nil {
			running[id] = true
		}
		return err
	}
	if err := start("a1", "a", 10); err != nil {
		t.Fatal(err)
	}
	if err := start("a2", "a", 10); err != nil {
		t.Fatal(err)
	}
	if err := start("a3", "a", 10); !errors.Is(err, ErrQuota) {
		t.Fatalf("a's third request: %v, want ErrQuota", err)
	}
	if err := start("b1", "b", 10); err != nil {
		t.Fatalf("b while a is at its quota: %v", err)
	}
	if err := q.Grow("a1", 81, live); !errors.Is(err, ErrQuota) {
		t.Fatalf("a growing past its bytes: %v, want ErrQuota", err)
	}
	if err := q.Grow("a1", 80, live); err != nil {
		t.Fatalf("a growing to its bytes: %v", err)
	}
	if err := q.Grow("b1", 80, live); err != nil {
		t.Fatalf("b growing while a is at its bytes: %v", err)
	}
	q.End("a2")
	delete(running, "a2")
	if err := start("a3", "a", 0); err != nil {
		t.Fatalf("a after one of its requests ended: %v", err)
	}
	delete(running, "a1") // stopped without an End (expired, fenced)
	if err := start("a4", "a", 10); err != nil {
		t.Fatalf("a after a request stopped on its own: %v", err)
	}
	if u := q.Engine("a"); u.Requests != 2 || u.Bytes != 10*TokenBytes {
		t.Fatalf("a holds %+v, want 2 requests of %d bytes", u, 10*TokenBytes)
	}
	// The member's share: a (10), b (90), c (60) and d stop at 250 tokens.
	if err := start("c1", "c", 60); err != nil {
		t.Fatal(err)
	}
	if err := start("d1", "d", 95); !errors.Is(err, ErrQuota) {
		t.Fatalf("a start past the member's share: %v, want ErrQuota", err)
	}
	if r := q.Refused(); r["requests"] != 1 || r["bytes"] != 1 || r["member_bytes"] != 1 {
		t.Fatalf("refusals %v, want one of each", r)
	}
	var none *Quota
	if err := none.Start("x", "a", 1<<20, live); err != nil {
		t.Fatalf("a nil quota: %v", err)
	}
}

// TestAppendBoundsGeneratedTokens: request.progress cannot grow one
// request past MaxGenerated tokens, whatever its prompt.
func TestAppendBoundsGeneratedTokens(t *testing.T) {
	st, err := New(&messages.StartRequestMsg{RequestId: "r1", Params: &messages.KVTransferParams{TransferId: "t"}, PromptTokenIds: []uint32{1}}, "m1", time.Unix(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	st, err = Append(st, 1, make([]uint32, MaxGenerated), time.Unix(2, 0))
	if err != nil {
		t.Fatalf("appending up to the bound: %v", err)
	}
	if _, err := Append(st, 1, []uint32{7}, time.Unix(3, 0)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("appending past %d generated tokens: %v, want ErrInvalid", MaxGenerated, err)
	}
}
