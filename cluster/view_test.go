package cluster

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runViewScript drives a view of member "a" (DefaultLocalConfig: suspect
// after 100ms, TTL 1s, re-probe every 50ms) through a script. Each command
// line may be followed by "=> <effects>"; a command without one must have
// no effects. Commands:
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
func runViewScript(t *testing.T, script string) {
	t.Helper()
	start := time.Unix(1_700_000_000, 0)
	now := start
	self := Member{ID: "a", Host: "127.0.0.1", Port: 1000, Role: RoleDecode}
	v := newView(DefaultLocalConfig(), &self)

	lines := scriptLines(script)
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		want := "none"
		if i+1 < len(lines) && strings.HasPrefix(lines[i+1], "=>") {
			want = strings.TrimSpace(strings.TrimPrefix(lines[i+1], "=>"))
			i++
		}
		f := strings.Fields(line)
		args := map[string]string{}
		for _, a := range f[1:] {
			if k, val, ok := strings.Cut(a, "="); ok {
				args[k] = val
			}
		}
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
		if got != want {
			t.Errorf("at %v, %q:\n got  %s\n want %s", now.Sub(start), line, got, want)
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

func TestViewJoinAndLoad(t *testing.T) {
	runViewScript(t, `
		members
		=> a
		deadline
		=> never
		hb b load=1
		=> joined b; announce
		hb c role=prefill
		=> joined c; announce
		# the same record again changes nothing
		hb b load=1
		hb b load=4
		=> changed
		members
		=> a b(4) c
		deadline
		=> +100ms
	`)
}

func TestViewCrashIsFoundByProbe(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		advance 60ms
		tick
		advance 40ms
		tick
		=> suspect b; probe b
		# a probe in flight is not repeated
		advance 10ms
		tick
		members
		=> a b?
		probe-unreachable b
		=> left b (unreachable); report b (unreachable)
		members
		=> a
		# its id stays dead: a late heartbeat is refuted, not re-added
		hb b
		=> refute b
		hb b
		advance 100ms
		hb b
		=> refute b
	`)
}

// TestViewStaleDepartureAfterRejoin: a member evicted for a hang rejoins
// under a new id (b2, same connexd); reports about the evicted id that
// arrive afterwards (another member's dead notice, protoactor blocking it,
// a late probe answer, a broken stream) change nothing: the live incarnation stays, and no
// second departure is reported. The daemon also ignores a departure while a
// live member carries the same name (clusterMembers.OnLeft), and readers
// bind their pulls to the holder's incarnation (actors.HolderWatch).
func TestViewStaleDepartureAfterRejoin(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		advance 1s
		tick
		=> left b (timeout); report b (timeout)
		hb b2
		=> joined b2; announce
		dead b by=c
		blocked b
		# the evicted incarnation, still talking, is told it is dead
		# (once per suspicion period)
		probe-ok b
		=> refute b
		hint b
		hb b
		members
		=> a b2
	`)
}

func TestViewHangIsRemovedAtTTL(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		advance 100ms
		tick
		=> suspect b; probe b
		advance 50ms
		probe-timeout b
		deadline
		=> +200ms
		# re-probed once per heartbeat interval after the previous probe ended
		advance 49ms
		tick
		advance 1ms
		tick
		=> probe b
		advance 50ms
		probe-timeout b
		advance 400ms
		tick
		=> probe b
		# the probe is still in flight: nothing new to do
		advance 349ms
		tick
		deadline
		=> +1s
		advance 1ms
		tick
		=> left b (timeout); report b (timeout)
		deadline
		=> never
	`)
}

func TestViewSuspectRecovers(t *testing.T) {
	runViewScript(t, `
		hb b load=2
		=> joined b; announce
		advance 120ms
		tick
		=> suspect b; probe b
		probe-ok b load=3
		=> alive b
		members
		=> a b(3)
		# its last gap was 120 ms: it is given two of those (240 ms) before
		# it is suspected again
		advance 239ms
		tick
		deadline
		=> +360ms
	`)
}

func TestViewHintProbesAtOnce(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		advance 5ms
		hint b
		=> suspect b; probe b
		hint b
		probe-unreachable b
		=> left b (unreachable); report b (unreachable)
		hint b
		hint nobody
	`)
}

func TestViewHintThenHeartbeatClearsSuspicion(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		hint b
		=> suspect b; probe b
		advance 20ms
		hb b
		=> alive b
		probe-ok b
		tick
	`)
}

func TestViewGracefulLeave(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		hb c
		=> joined c; announce
		leave b
		=> left b (leave)
		leave b
		members
		=> a c
		# a notice about an id never seen still blocks it
		dead z by=c
		hb z
		=> refute z
	`)
}

func TestViewDeadNoticeAboutOthersAndSelf(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		dead b by=c
		=> left b (reported)
		dead a by=c
		=> self-evicted a (reported)
		dead a by=b
		members
		=> a
		# our own leave echoed back is not an eviction
	`)
	runViewScript(t, `
		leave a
		members
		=> a
	`)
}

func TestViewBlockedByProtoactor(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		blocked b
		=> left b (blocked)
		blocked b
		hb b
		=> refute b
	`)
}

func TestViewReconnectForgivesSilence(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		# our NATS link was down for 900ms: the provider does not tick then
		advance 900ms
		reconnected
		advance 99ms
		tick
		advance 1ms
		tick
		=> suspect b; probe b
	`)
}

func TestViewOwnPauseForgivesSilence(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		advance 50ms
		tick
		# this process was frozen (SIGSTOP) for 2s: far past b's TTL, but the
		# silence was ours, so b is not timed out; it gets a fresh grace
		advance 2s
		tick
		advance 99ms
		tick
		advance 1ms
		tick
		=> suspect b; probe b
	`)
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

// TestViewStarvedObserverDoesNotSuspect: this process is CPU-starved, so
// its loop wakes far past its deadlines while the others' heartbeats queue
// behind it (drained on waking, before the tick). The time it was
// descheduled is its own lag, not their silence: nobody is suspected,
// although 250 ms pass between two heartbeats it reads (the plain silence
// rule suspects after 100 ms: TestViewCrashIsFoundByProbe).
func TestViewStarvedObserverDoesNotSuspect(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		advance 50ms
		hb b
		tick
		# asked to wake at +100ms, woke at +300ms; b beat meanwhile, queued
		advance 50ms
		late 200ms
		tick
		hb b
		tick
		advance 40ms
		late 180ms
		hb b
		tick
		advance 50ms
		late 60ms
		tick
		hb b
		members
		=> a b
	`)
}

// TestViewStarvedObserverStillFindsTheSilent: the same starved observer
// still suspects a member that is truly silent, and removes it, once the
// time it was itself awake reaches the bounds (100 ms, TTL 1 s): each step
// below is 50 ms awake and 150 ms descheduled.
func TestViewStarvedObserverStillFindsTheSilent(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		advance 50ms
		late 150ms
		tick
		advance 50ms
		late 150ms
		tick
		=> suspect b; probe b
		probe-timeout b
	`+strings.Repeat(`
		advance 50ms
		late 150ms
		tick
		=> probe b
		probe-timeout b
	`, 17)+`
		advance 50ms
		late 150ms
		tick
		=> left b (timeout); report b (timeout)
	`)
}

// TestViewLateMemberGetsRoom: a member whose own heartbeats come late (it
// is CPU-starved: gaps of 150 ms instead of 50) is suspected only after
// SuspectMult of its own recent gaps (300 ms), not after 100 ms; one that
// falls truly silent is still suspected then, and removed at the TTL.
func TestViewLateMemberGetsRoom(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		advance 50ms
		hb b
		advance 150ms
		tick
		=> suspect b; probe b
		hb b
		=> alive b
		probe-ok b
		advance 150ms
		hb b
		deadline
		=> +650ms
		advance 299ms
		tick
		advance 1ms
		tick
		=> suspect b; probe b
		probe-timeout b
		advance 349ms
		tick
		=> probe b
		probe-timeout b
		advance 350ms
		tick
		=> probe b
		probe-timeout b
		advance 1ms
		tick
		=> left b (timeout); report b (timeout)
	`)
}

// TestViewLateMemberRoomIsCapped: however late a member's heartbeats have
// been, it is suspected after at most half the TTL (500 ms), so it is
// probed long before it could time out.
func TestViewLateMemberRoomIsCapped(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		advance 900ms
		hb b
		advance 499ms
		tick
		advance 1ms
		tick
		=> suspect b; probe b
	`)
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

// TestViewStalledBusDoesNotEvict: the NATS server (or the process hosting
// it) is CPU-starved and delivers nothing, not even our own heartbeat back
// to us: the others' silence then proves nothing, and nobody is removed
// however long it lasts. (Seen with eight CPU burners: the members' loops
// ran on time, the bus did not, and members timed each other out.)
func TestViewStalledBusDoesNotEvict(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		hb a
	`+strings.Repeat(`
		advance 50ms
		tick
	`, 40)+`
		members
		=> a b
		# the bus is back: our echo and b's heartbeat arrive
		hb a
		hb b
		advance 50ms
		tick
		members
		=> a b
	`)
}

// TestViewFlowingBusStillFindsTheSilent: while our own heartbeats come
// back every interval, a silent member is suspected after 100 ms and
// removed after the 1 s TTL, as without the echo rule.
func TestViewFlowingBusStillFindsTheSilent(t *testing.T) {
	runViewScript(t, `
		hb b
		=> joined b; announce
		hb a
		advance 50ms
		hb a
		tick
		advance 50ms
		hb a
		tick
		=> suspect b; probe b
		probe-timeout b
	`+strings.Repeat(`
		advance 50ms
		hb a
		tick
		=> probe b
		probe-timeout b
	`, 17)+`
		advance 50ms
		hb a
		tick
		=> left b (timeout); report b (timeout)
	`)
}
