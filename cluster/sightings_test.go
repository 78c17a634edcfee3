package cluster

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSightings drives Sightings of member "a" (grace 1s, started at t0)
// through membership events at explicit times and checks the Roster and
// departure times it gives.
func TestSightings(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	type step struct {
		ms    int    // when, after t0
		event string // "join b", "leave b", "suspect b", "join " (unnamed), "rejoin"
	}
	for _, c := range []struct {
		name    string
		steps   []step
		ms      int    // when the roster is read
		present string // names in the view then
		// want, as sorted space-separated names
		departed, settled string
		watched           time.Duration
		departedAt        map[string]int // name → ms after t0 (-1: zero time)
	}{
		{
			name:  "just joined: nobody is settled, not even this member",
			steps: []step{{0, "join a"}, {0, "join b"}},
			ms:    999, present: "a b",
			watched: 999 * time.Millisecond,
		},
		{
			name:  "after the grace everyone seen from the start is settled",
			steps: []step{{0, "join a"}, {0, "join b"}},
			ms:    1000, present: "a b",
			settled: "a b", watched: time.Second,
		},
		{
			name: "this member settles by its own watch, without a join event",
			ms:   1000, present: "a",
			settled: "a", watched: time.Second,
		},
		{
			name:  "a member that joined later settles a grace after its join",
			steps: []step{{0, "join b"}, {400, "join c"}},
			ms:    1300, present: "a b c",
			settled: "a b", watched: 1300 * time.Millisecond,
		},
		{
			name:  "repeated joins keep the first sighting",
			steps: []step{{0, "join b"}, {900, "join b"}},
			ms:    1000, present: "a b",
			settled: "a b", watched: time.Second,
		},
		{
			name:  "a departure is remembered with its first time",
			steps: []step{{0, "join b"}, {200, "leave b"}, {500, "leave b"}},
			ms:    600, present: "a",
			departed: "b", watched: 600 * time.Millisecond,
			departedAt: map[string]int{"b": 200},
		},
		{
			name:  "a member back after leaving is not departed, and its tenure starts again",
			steps: []step{{0, "join b"}, {200, "leave b"}, {300, "join b"}},
			ms:    1200, present: "a b",
			settled: "a", watched: 1200 * time.Millisecond,
			departedAt: map[string]int{"b": -1},
		},
		{
			name:  "a departed name present again before its join event is present, not departed",
			steps: []step{{0, "join b"}, {200, "leave b"}},
			ms:    300, present: "a b",
			watched:    300 * time.Millisecond,
			departedAt: map[string]int{"b": 200},
		},
		{
			name:  "suspicion and unnamed members change nothing",
			steps: []step{{0, "join b"}, {100, "suspect b"}, {100, "join "}, {100, "leave "}},
			ms:    1000, present: "a b",
			settled: "a b", watched: time.Second,
		},
		{
			name:  "a rejoin forgets departures and tenures and restarts the watch",
			steps: []step{{0, "join b"}, {100, "leave c"}, {2000, "rejoin"}, {2000, "join b"}},
			ms:    2500, present: "a b",
			watched:    500 * time.Millisecond,
			departedAt: map[string]int{"c": -1},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := NewSightings("a", time.Second, t0)
			for _, st := range c.steps {
				verb, name, _ := strings.Cut(st.event, " ")
				switch verb {
				case "rejoin":
					s.Rejoin(at(st.ms))
				case "join":
					s.Observe(Event{Type: EventJoined, Member: Member{ID: name + "-id", Name: name}}, at(st.ms))
				case "leave":
					s.Observe(Event{Type: EventLeft, Member: Member{ID: name + "-id", Name: name}, Reason: ReasonTimeout}, at(st.ms))
				case "suspect":
					s.Observe(Event{Type: EventSuspect, Member: Member{ID: name + "-id", Name: name}}, at(st.ms))
				default:
					t.Fatalf("bad step %q", st.event)
				}
			}
			r := s.Roster(strings.Fields(c.present), at(c.ms))
			if got := names(r.Present); got != c.present {
				t.Errorf("present %q, want %q", got, c.present)
			}
			if got := names(r.Departed); got != c.departed {
				t.Errorf("departed %q, want %q", got, c.departed)
			}
			if got := names(r.Settled); got != c.settled {
				t.Errorf("settled %q, want %q", got, c.settled)
			}
			if r.Watched != c.watched || r.Grace != time.Second {
				t.Errorf("watched %v grace %v, want %v and 1s", r.Watched, r.Grace, c.watched)
			}
			for n, ms := range c.departedAt {
				want := time.Time{}
				if ms >= 0 {
					want = at(ms)
				}
				if got := s.DepartedAt(n); !got.Equal(want) {
					t.Errorf("DepartedAt(%s) = %v, want %v", n, got, want)
				}
			}
		})
	}
}

// names renders a set as sorted space-separated names.
func names(set map[string]bool) string {
	var out []string
	for n, ok := range set {
		if ok {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// TestSettleAfter: the grace is one TTL plus two heartbeats for every preset.
func TestSettleAfter(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		want time.Duration
	}{
		{"local", DefaultLocalConfig(), time.Second + 100*time.Millisecond},
		{"lan", DefaultLANConfig(), 5*time.Second + 400*time.Millisecond},
		{"wan", DefaultWANConfig(), 17 * time.Second},
	} {
		if got := c.cfg.SettleAfter(); got != c.want {
			t.Errorf("%s: SettleAfter() = %v, want %v", c.name, got, c.want)
		}
	}
}
