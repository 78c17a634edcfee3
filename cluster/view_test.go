package cluster

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// A view script drives a view of member "a" (DefaultLocalConfig: suspect
// after 100ms, TTL 1s, re-probe every 50ms), one command at a time, each
// answering the view's effects ("none" for none). The scripts live in
// testdata/view/ (TestViewScripts, datadriven: a command, "----", its
// effects, a blank line; # starts a comment; run with -rewrite after a
// deliberate change of the rules); runViewScript runs one inline, each
// command followed by "=> <effects>" unless it has none. Commands:
//
//	hb <id> [load=N] [role=R] [every=D]
//	                            heartbeat from id ("hb a": our own, echoed);
//	                            every= the heartbeat interval it announces
//	beat-every <duration>       we heartbeat at this interval from now
//	lag                         => our own lag so far (woke and bus stalls)
//	advance <duration>          move the fake clock
//	tick                        let time act
//	probe-ok <id> [load=N]      a probe of id was answered
//	probe-timeout <id>          a probe of id timed out
//	probe-unreachable <id>      a probe of id found no subscriber
//	hint <id>                   protoactor lost its stream to id
//	leave <id>                  id left gracefully
//	dead <id> by=<reporter>     a dead notice about id
//	blocked <id>                protoactor blocked id itself
//	reconnected                 our NATS link came back
//	late <duration>             our own loop woke this much past its
//	                            deadline (we were CPU-starved): the clock
//	                            moves and the view is told (woke)
//	members                     => live members, suspects marked with ?
//	deadline                    => next deadline relative to the start
type viewScript struct {
	t          testing.TB
	start, now time.Time
	v          *view
}

func newViewScript(t testing.TB) *viewScript {
	start := time.Unix(1_700_000_000, 0)
	self := Member{ID: "a", Host: "127.0.0.1", Port: 1000, Role: RoleDecode}
	return &viewScript{t: t, start: start, now: start, v: newView(DefaultLocalConfig(), &self)}
}

// do runs one command line and returns the view's effects.
func (s *viewScript) do(line string) string {
	t, v := s.t, s.v
	f := strings.Fields(line)
	args := map[string]string{}
	for _, a := range f[1:] {
		if k, val, ok := strings.Cut(a, "="); ok {
			args[k] = val
		}
	}
	now, start := s.now, s.start
	defer func() { s.now = now }()
	member := func() Member {
		m := Member{ID: f[1], Host: "127.0.0.1", Port: 2000 + int(f[1][0]), Role: RoleDecode}
		if r, ok := args["role"]; ok {
			m.Role = Role(r)
		}
		if l, ok := args["load"]; ok {
			n, err := strconv.ParseInt(l, 10, 64)
			if err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			m.Load = n
		}
		if e, ok := args["every"]; ok {
			d, err := time.ParseDuration(e)
			if err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			m.HeartbeatInterval = d
		}
		return m
	}
	var got string
	switch f[0] {
	case "hb":
		got = v.heartbeat(member(), now).String()
	case "advance":
		d, err := time.ParseDuration(f[1])
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		now = now.Add(d)
		got = "none"
	case "tick":
		got = v.tick(now).String()
	case "probe-ok":
		got = v.probeAnswered(member(), now).String()
	case "probe-timeout":
		got = v.probeFailed(f[1], false, now).String()
	case "probe-unreachable":
		got = v.probeFailed(f[1], true, now).String()
	case "hint":
		got = v.hint(f[1], now).String()
	case "leave":
		got = v.left(f[1], f[1], now).String()
	case "dead":
		got = v.left(f[1], args["by"], now).String()
	case "blocked":
		got = v.blocked(f[1]).String()
	case "beat-every":
		d, err := time.ParseDuration(f[1])
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		v.beatsEvery(d, now)
		got = "none"
	case "lag":
		got = v.lag.String()
	case "reconnected":
		v.reconnected(now)
		got = "none"
	case "late":
		d, err := time.ParseDuration(f[1])
		if err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		due := now
		now = now.Add(d)
		v.woke(now, due)
		got = "none"
	case "members":
		var ms []string
		for _, m := range v.liveMembers() {
			s := m.ID
			if m.Suspect {
				s += "?"
			}
			if m.Load != 0 {
				s += fmt.Sprintf("(%d)", m.Load)
			}
			ms = append(ms, s)
		}
		got = strings.Join(ms, " ")
	case "deadline":
		d := v.nextDeadline()
		if d.IsZero() {
			got = "never"
		} else {
			got = "+" + d.Sub(start).String()
		}
	default:
		t.Fatalf("unknown command %q", line)
	}
	return got
}

// TestViewScripts runs the view's scripts in testdata/view/.
func TestViewScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/view", func(t *testing.T, path string) {
		s := newViewScript(t)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			line := d.Cmd
			for _, a := range d.CmdArgs {
				line += " " + a.String()
			}
			return s.do(line) + "\n"
		})
	})
}

// runViewScript runs an inline view script (see viewScript).
func runViewScript(t *testing.T, script string) {
	t.Helper()
	s := newViewScript(t)
	lines := scriptLines(script)
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		want := "none"
		if i+1 < len(lines) && strings.HasPrefix(lines[i+1], "=>") {
			want = strings.TrimSpace(strings.TrimPrefix(lines[i+1], "=>"))
			i++
		}
		if got := s.do(line); got != want {
			t.Errorf("at %v, %q:\n got  %s\n want %s", s.now.Sub(s.start), line, got, want)
		}
	}
}

func scriptLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

func TestPausedAfter(t *testing.T) {
	for _, c := range []struct{ suspect, ttl, want time.Duration }{
		{100 * time.Millisecond, time.Second, 500 * time.Millisecond},
		{600 * time.Millisecond, 5 * time.Second, 2500 * time.Millisecond},
		{400 * time.Millisecond, time.Second, 800 * time.Millisecond},
	} {
		if got := pausedAfter(c.suspect, c.ttl); got != c.want {
			t.Errorf("pausedAfter(%s, %s) = %s, want %s", c.suspect, c.ttl, got, c.want)
		}
	}
}

func TestViewClientHasNoSelf(t *testing.T) {
	v := newView(DefaultLocalConfig(), nil)
	now := time.Unix(0, 0)
	if got := v.heartbeat(Member{ID: "b"}, now).String(); got != "joined b; announce" {
		t.Fatalf("heartbeat: %s", got)
	}
	if got := v.left("a", "b", now).String(); got != "none" {
		t.Fatalf("notice about an unknown id: %s", got)
	}
	if ms := v.liveMembers(); len(ms) != 1 || ms[0].ID != "b" {
		t.Fatalf("members = %v", ms)
	}
}

func TestViewMembersAreCopies(t *testing.T) {
	v := newView(DefaultLocalConfig(), nil)
	v.heartbeat(Member{ID: "b", Kinds: []string{"request"}}, time.Unix(0, 0))
	v.liveMembers()[0].Kinds[0] = "mutated"
	if got := v.liveMembers()[0].Kinds[0]; got != "request" {
		t.Fatalf("view aliased its kinds: %q", got)
	}
}

func TestSuspicionTimeout(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		base     time.Duration
		mult     int
		gap, cap time.Duration
		want     time.Duration
	}{
		{100 * ms, 2, 0, 500 * ms, 100 * ms},        // no gap seen yet: the base
		{100 * ms, 2, 50 * ms, 500 * ms, 100 * ms},  // beating on time: the base
		{100 * ms, 2, 55 * ms, 500 * ms, 110 * ms},  // jitter: two of its own gaps
		{100 * ms, 2, 150 * ms, 500 * ms, 300 * ms}, // starved: room in proportion
		{100 * ms, 2, 900 * ms, 500 * ms, 500 * ms}, // never past the cap
		{600 * ms, 3, 400 * ms, 2500 * ms, 1200 * ms},
	} {
		if got := suspicionTimeout(c.base, c.mult, c.gap, c.cap); got != c.want {
			t.Errorf("suspicionTimeout(%s, %d, %s, %s) = %s, want %s", c.base, c.mult, c.gap, c.cap, got, c.want)
		}
	}
	for _, cfg := range []Config{DefaultLocalConfig(), DefaultLANConfig(), DefaultWANConfig()} {
		c := suspectCap(cfg.SuspectAfter(), cfg.TTL())
		if c < cfg.SuspectAfter() || c+cfg.ProbeTimeout > cfg.TTL() {
			t.Errorf("%+v: cap %s must lie in [SuspectAfter, TTL − ProbeTimeout]", cfg, c)
		}
	}
}
