package notices

import (
	"fmt"
	"testing"
	"time"
)

func seqs(es []Entry) string {
	s := ""
	for _, e := range es {
		s += fmt.Sprintf(" %d:%v", e.Seq, e.Body)
	}
	return s
}

func TestJournalReplaysFromASequence(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	j := NewJournal(3, time.Minute)
	if es, last, gap := j.Since("e", 0, 0, t0); es != nil || last != 0 || gap {
		t.Fatalf("empty journal: %v %d %v", es, last, gap)
	}
	for i, b := range []string{"a", "b", "c", "d"} {
		if got := j.Append("e", b, t0.Add(time.Duration(i)*time.Second)); got != uint64(i+1) {
			t.Fatalf("Append %s = %d, want %d", b, got, i+1)
		}
	}
	j.Append("other", "x", t0)
	now := t0.Add(5 * time.Second)
	for _, c := range []struct {
		after uint64
		max   int
		want  string
		gap   bool
	}{
		{after: 4, want: ""},
		{after: 2, want: " 3:c 4:d"},
		{after: 1, want: " 2:b 3:c 4:d"},
		{after: 1, max: 1, want: " 2:b"},
		{after: 0, want: " 2:b 3:c 4:d", gap: true}, // 1 fell out (limit 3)
		{after: 9, want: " 2:b 3:c 4:d", gap: true}, // another journal's sequence
	} {
		es, last, gap := j.Since("e", c.after, c.max, now)
		if seqs(es) != c.want || last != 4 || gap != c.gap {
			t.Errorf("Since(after=%d, max=%d) = %q last=%d gap=%v, want %q last=4 gap=%v", c.after, c.max, seqs(es), last, gap, c.want, c.gap)
		}
	}
	// Age: just after t0+62s, b (t0+1s) and c (t0+2s) are over a minute old.
	es, last, gap := j.Since("e", 1, 0, t0.Add(62*time.Second+time.Millisecond))
	if seqs(es) != " 4:d" || last != 4 || !gap {
		t.Fatalf("after aging: %q last=%d gap=%v, want \" 4:d\" last=4 gap", seqs(es), last, gap)
	}
	if j.Last("e") != 4 || j.Last("other") != 1 || j.Last("none") != 0 {
		t.Fatalf("Last: %d %d %d", j.Last("e"), j.Last("other"), j.Last("none"))
	}
	j.Forget("e")
	if j.Last("e") != 0 || j.Append("e", "z", now) != 1 {
		t.Fatal("a forgotten engine starts again at 1")
	}
	// A journal that kept nothing yet reached a sequence: no gap for a
	// caller that is up to date, a gap for one that is not.
	k := NewJournal(1, time.Second)
	k.Append("e", "a", t0)
	k.Append("e", "b", t0)
	if es, _, gap := k.Since("e", 2, 0, t0.Add(time.Hour)); es != nil || gap {
		t.Fatalf("up to date after everything aged out: %v gap=%v", es, gap)
	}
	if _, _, gap := k.Since("e", 1, 0, t0.Add(time.Hour)); !gap {
		t.Fatal("behind after everything aged out: want a gap")
	}
}

// TestJournalAtItsLimitDoesNotCopy: a journal at its limit drops one entry
// per Append without copying the rest each time (amortised, an allocation
// per about Limit appends, not one per append), and still keeps the newest
// Limit entries.
func TestJournalAtItsLimitDoesNotCopy(t *testing.T) {
	const limit = 1024
	j := NewJournal(limit, time.Hour)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	body := any("notice")
	for range 2 * limit {
		j.Append("e", body, t0)
	}
	if allocs := testing.AllocsPerRun(4*limit, func() { j.Append("e", body, t0) }); allocs > 0.01 {
		t.Fatalf("%.3f allocations per Append at the limit: the kept entries are copied", allocs)
	}
	entries, last, gap := j.Since("e", 0, 0, t0)
	if len(entries) != limit || entries[0].Seq != last-limit+1 || entries[limit-1].Seq != last || !gap {
		t.Fatalf("kept %d entries, %d..%d of last %d, gap %v", len(entries), entries[0].Seq, entries[len(entries)-1].Seq, last, gap)
	}
}
