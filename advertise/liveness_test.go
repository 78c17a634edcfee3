package advertise

import "testing"

func TestLiveness(t *testing.T) {
	const refused, timeout = Refused, Failed
	steps := []struct {
		id, inst string
		err      Dial
		want     Verdict
		why      string
	}{
		{"d0", "a", refused, Unchanged, "never seen listening: it may register before it serves"},
		{"d0", "a", Connected, Listening, "listening"},
		{"d0", "a", Connected, Unchanged, "still listening"},
		{"d0", "a", timeout, Unchanged, "a timeout is slow or paused, not gone"},
		{"d0", "b", refused, Unchanged, "a new instance not yet seen listening"},
		{"d0", "a", refused, Gone, "seen listening, now refused: gone"},
		{"d0", "a", refused, Unchanged, "judged once"},
		{"d1", "x", Connected, Listening, "listening"},
		{"d1", "y", Connected, Listening, "a new instance listening"},
		{"d1", "y", refused, Gone, "gone"},
	}
	l := NewLiveness()
	for i, s := range steps {
		if got := l.Observe(s.id, s.inst, s.err); got != s.want {
			t.Fatalf("step %d (%s): verdict %v, want %v", i, s.why, got, s.want)
		}
	}
	l.Observe("d2", "y", Connected)
	l.Forget(func(id string) bool { return id != "d2" })
	if l.Observe("d2", "y", refused) != Unchanged {
		t.Fatal("a forgotten engine was judged")
	}
}
