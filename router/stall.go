package router

import (
	"slices"
	"time"
)

// gapWindow is how many recent inter-token gaps the stall deadline looks at.
const gapWindow = 16

// Stall decides when a decode stream counts as stalled. It is pure: the
// relay feeds it token arrival times and asks for the current deadline.
type Stall struct {
	// Min is the shortest stall that counts (router_stall_ms).
	Min time.Duration
	// Factor scales the longest recent inter-token gap (router_stall_factor).
	Factor int
	// FirstToken bounds the wait for a leg's first token (router_first_token_ms).
	FirstToken time.Duration

	last time.Time
	gaps []time.Duration
	// grace is how far the router's own lateness has pushed the current
	// deadline back (Expired), at most one window; a token clears it.
	grace time.Duration
	// probes is how many times the engine, silent past the deadline,
	// answered a health probe in the current gap (Alive); a token clears it.
	probes int
	// aliveUntil is the deadline an answered probe set (zero if none).
	aliveUntil time.Time
}

// maxAliveProbes is how many answered health probes may hold off a
// stall in one gap between tokens: a CPU-starved engine answers late but
// answers, and gets that many more windows; an engine that answers but
// never sends a token again is still given up after them.
const maxAliveProbes = 2

// lateTolerance is how late a stall timer may fire and still be on time.
// Later than that, the router itself was not running (CPU-starved, a GC
// pause): tokens the engine sent meanwhile may still wait unread in the
// socket, so the silence is not yet the engine's.
const lateTolerance = 10 * time.Millisecond

// Start begins a leg at now: its first token may take FirstToken. Gaps seen
// on earlier legs of the same request are kept: the engines are alike.
func (s *Stall) Start(now time.Time) {
	s.last, s.grace, s.probes, s.aliveUntil = time.Time{}, 0, 0, time.Time{}
	_ = now
}

// Token records a token arriving at now.
func (s *Stall) Token(now time.Time) {
	if !s.last.IsZero() {
		s.gaps = append(s.gaps, now.Sub(s.last))
		if len(s.gaps) > gapWindow {
			s.gaps = s.gaps[1:]
		}
	}
	s.last, s.grace, s.probes, s.aliveUntil = now, 0, 0, time.Time{}
}

// Probe reports whether an engine silent past its deadline should be asked
// whether it lives (a health probe) before its leg is failed: true until
// maxAliveProbes probes have answered in this gap.
func (s *Stall) Probe() bool { return s.probes < maxAliveProbes }

// Alive records that the engine answered a health probe at now although it
// sent no token: it is alive, only slow (CPU-starved), so it gets one more
// window from now before it counts as stalled.
func (s *Stall) Alive(now time.Time) {
	s.probes++
	s.aliveUntil = now.Add(s.Window())
}

// Deadline is when the current leg counts as stalled, given that it started
// at legStart.
func (s *Stall) Deadline(legStart time.Time) time.Time {
	d := s.last.Add(s.Window() + s.grace)
	if s.last.IsZero() {
		d = legStart.Add(s.FirstToken + s.grace)
	}
	return later(d, s.aliveUntil)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Expired decides, when the stall timer fires at now, whether the leg has
// stalled. A timer that fires more than lateTolerance past the deadline
// says the router was late, not necessarily the engine: the deadline moves
// back by that lateness, so the readers get the time to deliver what
// waited, and the leg is judged again then. The moves add up to at most
// one window per gap, so a truly silent engine is still found within two
// windows and the router's last lateness.
func (s *Stall) Expired(legStart, now time.Time) bool {
	due := s.Deadline(legStart)
	if now.Before(due) {
		return false
	}
	limit := s.Window()
	if s.last.IsZero() {
		limit = s.FirstToken
	}
	if late := now.Sub(due); late > lateTolerance && s.grace < limit {
		s.grace = min(limit, s.grace+late)
		return false
	}
	return true
}

// Window is how long a token may take after the previous one: the longest
// of Min, Factor times the median of the recent gaps, and twice the longest
// recent gap. The median keeps one slow token (a GC pause, a scheduling
// hiccup on a busy host) from inflating the window eightfold; twice the
// longest keeps an engine whose gaps are uneven from tripping it.
func (s *Stall) Window() time.Duration {
	w := s.Min
	if len(s.gaps) > 0 {
		sorted := slices.Clone(s.gaps)
		slices.Sort(sorted)
		w = max(w, time.Duration(s.Factor)*sorted[len(sorted)/2], 2*sorted[len(sorted)-1])
	}
	return w
}

// Last is when the current leg's last token arrived (zero before its first).
func (s *Stall) Last() time.Time { return s.last }
