package router

import "time"

// Stall decides, for one request's decode legs, when a silent leg is
// suspected (its engine is asked GET /health) and when it is given up (the
// stream resumes elsewhere). It is pure: the relay feeds it the times of
// tokens, of its timer firing and of probe answers, and arms its timer for
// the time each of those returns.
//
// In each silence (since the leg's last token, its start, or an answered
// probe) with window W (StallRule): at half the window the engine is
// probed, at the full window the leg is given up unless the probe said the
// engine lives; an answer gives AliveWindow more from then, at most
// maxAliveProbes times per gap between tokens; so does a token the engine
// sent on another of the router's legs late in the silence (Check). So a hung engine costs W,
// not W plus a probe's timeout, and a starved one has half a window to
// show it lives. A leg with nowhere to go is kept (Keep).
type Stall struct {
	// Rule is the stall rule; its zero value is not usable (see StallRule.Check).
	Rule StallRule

	gaps []time.Duration
	// last is the current leg's last token (zero before its first).
	last time.Time
	// start is when the current leg started.
	start time.Time
	// base is where the current silence began: the last token, the leg's
	// start or the last answered probe.
	base time.Time
	// window is the current silence's length before the leg is given up.
	window time.Duration
	// grace is how far the router's own lateness has pushed the current
	// silence's times back (Check), at most one window; a token clears it.
	grace time.Duration
	// alive is how many probes answered in the current gap between tokens.
	alive int
	// probed: a probe was sent in the current silence.
	probed bool
	// probe numbers the probes sent; out is the one awaited (0: none).
	probe, out int
	// due is when the relay's timer was last armed for, to measure how
	// late a Check comes.
	due time.Time
}

// maxAliveProbes is how many answered health probes may hold off a stall in
// one gap between tokens: an engine that answers but never sends a token
// again is still given up after them.
const maxAliveProbes = 3

// lateTolerance is how late a stall timer may fire and still be on time.
// Later than that, the router itself was not running (CPU-starved, a GC
// pause): tokens the engine sent meanwhile may still wait unread in the
// socket, so the silence is not yet the engine's.
const lateTolerance = 10 * time.Millisecond

// StallStep is what the relay does after a Check.
type StallStep struct {
	// Next is when the relay's timer is to fire again (unless Stalled).
	Next time.Time
	// Stalled: give the leg up now and resume the stream elsewhere.
	Stalled bool
	// Probe, if not zero, names a health probe of the engine to send now;
	// its answer goes to Answer with this number.
	Probe int
}

// Start begins a leg at now: its first token may take Rule.FirstToken.
// Gaps seen on earlier legs of the same request are kept: the engines are
// alike. It returns when the relay's timer is to fire.
func (s *Stall) Start(now time.Time) time.Time {
	s.last, s.start = time.Time{}, now
	s.alive = 0
	s.silence(now, s.Rule.FirstToken)
	return s.arm()
}

// Token records a token arriving at now and returns when the relay's timer
// is to fire.
func (s *Stall) Token(now time.Time) time.Time {
	if !s.last.IsZero() {
		s.gaps = append(s.gaps, now.Sub(s.last))
		if len(s.gaps) > gapWindow {
			s.gaps = s.gaps[1:]
		}
	}
	s.last = now
	s.alive = 0
	s.silence(now, s.Rule.Window(s.gaps))
	return s.arm()
}

// silence starts a silence at now that the leg is given window for.
func (s *Stall) silence(now time.Time, window time.Duration) {
	s.base, s.window, s.grace, s.probed, s.out = now, window, 0, false, 0
}

// arm records and returns when the relay's timer is to fire next: the
// suspicion point (half the window) while a probe is still to be sent in
// this silence, else the deadline.
func (s *Stall) arm() time.Time {
	s.due = s.Deadline()
	if !s.probed && s.alive < maxAliveProbes {
		s.due = s.base.Add(s.window/2 + s.grace)
	}
	return s.due
}

// Due is when the relay's timer is to fire next (what the last Start,
// Token, Check or Answer returned).
func (s *Stall) Due() time.Time { return s.due }

// Deadline is when the current silence ends the leg.
func (s *Stall) Deadline() time.Time { return s.base.Add(s.window + s.grace) }

// Heard is what the router heard from the engines it streams from.
type Heard struct {
	// Engine is when the leg's own engine last showed life on any of the
	// router's legs to it (a token, an answered probe).
	Engine time.Time
	// Others is the last token from any other engine the router runs a
	// leg on now (zero: none).
	Others time.Time
}

// Check is called when the relay's timer fires at now (after its due time),
// with what the router heard. The silence is judged as the engine's only
// when nothing else explains it:
//
//   - its engine showed life on another leg in the second half of the
//     silence: the engine runs, the silence is this request's; it counts as
//     an answered probe (a hang silences every stream of its engine at
//     once, their last tokens within a token's time of each other; a
//     CPU-starved engine with many streams still delivers some);
//   - the timer fired more than lateTolerance late: the router was late,
//     not necessarily the engine, and tokens may wait unread; the silence's
//     times move back by that lateness;
//   - every other engine the router was streaming from when the silence
//     began fell silent with it: the host or the router's side stalled,
//     and another engine would do no better; the deadline is held half a
//     window ahead while that lasts.
//
// The two moves share one window per silence, so a silent engine is still
// given up within two windows (and the router's last lateness). The caller
// also holds off while tokens it has not read yet are queued.
func (s *Stall) Check(now time.Time, h Heard) StallStep {
	if h.Engine.After(s.base.Add(s.window/2)) && !h.Engine.After(now) && s.alive < maxAliveProbes {
		s.alive++
		s.silence(h.Engine, s.Rule.AliveWindow(s.gaps))
	}
	moved := false
	if late := now.Sub(s.due); late > lateTolerance && s.grace < s.window {
		s.grace = min(s.window, s.grace+late)
		moved = true
	}
	if next := s.arm(); now.Before(next) {
		return StallStep{Next: next}
	}
	if !s.probed && s.alive < maxAliveProbes {
		s.probed = true
		s.probe++
		s.out = s.probe
		return StallStep{Probe: s.probe, Next: s.arm()}
	}
	if moved || now.Before(s.Deadline()) {
		// A late check never gives a leg up itself: the relay reads what
		// waited first and checks again.
		return StallStep{Next: s.arm()}
	}
	if s.everyoneSilent(h.Others) && s.grace < s.window {
		s.grace = min(s.window, now.Sub(s.base.Add(s.window))+s.window/2)
		return StallStep{Next: s.arm()}
	}
	return StallStep{Stalled: true}
}

// everyoneSilent reports whether another engine was streaming to the router
// when the current silence began (its last token at most a window before)
// and has sent nothing since.
func (s *Stall) everyoneSilent(others time.Time) bool {
	return !others.IsZero() && !others.Before(s.base.Add(-s.window)) && !others.After(s.base)
}

// Answer records the answer at now to probe number probe (alive: the
// engine answered its health check) and returns when the relay's timer is
// to fire. An answer to a probe sent before the last token is moot and
// ignored. A live engine gets AliveWindow from now; a failed probe changes
// nothing (the deadline decides).
func (s *Stall) Answer(probe int, now time.Time, alive bool) time.Time {
	if probe == s.out {
		s.out = 0
		if alive {
			s.alive++
			s.silence(now, s.Rule.AliveWindow(s.gaps))
		}
	}
	return s.arm()
}

// Keep is called at now instead of giving a stalled leg up when no other
// engine could take the request: then waiting is the only way it can still
// complete, and moving it would turn a slow engine into an error. The leg
// is kept for another AliveWindow, as long as it has been silent for less
// than Rule.FirstToken (the longest the router waits for any token); then
// it is given up all the same and the request fails with a clear error
// rather than hang. It returns when the relay's timer is to fire, and
// whether the leg is kept.
func (s *Stall) Keep(now time.Time) (time.Time, bool) {
	since := s.last
	if since.IsZero() {
		since = s.start
	}
	if now.Sub(since) >= s.Rule.FirstToken {
		return time.Time{}, false
	}
	s.silence(now, s.Rule.AliveWindow(s.gaps))
	return s.arm(), true
}

// Outstanding is the number of the probe sent in the current silence and
// not answered yet (0: none).
func (s *Stall) Outstanding() int { return s.out }

// Window is the current silence's length before the leg is given up.
func (s *Stall) Window() time.Duration { return s.window }

// Last is when the current leg's last token arrived (zero before its first).
func (s *Stall) Last() time.Time { return s.last }
