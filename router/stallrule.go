package router

import (
	"fmt"
	"time"
)

// gapWindow is how many recent inter-token gaps the stall window looks at:
// a memory of a second or so at the pace of a GPU engine (10–20 ms a
// token), long enough to hold the last hiccup of an engine whose host is
// busy (with 16 gaps, a stream at 10 ms a token forgets one in 160 ms).
const gapWindow = 64

// warmGaps is how many gaps a stream must have shown before its window
// follows its own pace; until then the window is at least StallRule.Cold.
const warmGaps = 4

// StallRule is how long a decode stream may stay silent, given its own
// pace, before the router suspects its engine (and asks the engine's
// /health) and then gives up on it (and resumes the stream elsewhere). It is
// pure: the window is a function of the stream's recent inter-token gaps.
//
// A stream that has shown its pace gets Factor × its longest gap of the last
// gapWindow, clamped to [Floor, Ceiling]. The longest gap, not the median:
// an engine whose steps are uneven (batch changes, a KV load beside the
// step) shows that in its longest gap and is given room for three such
// hiccups in a row. The Floor is what a live engine may lose to its host
// without any sign in its history: a runnable process on a busy Linux host
// waits a scheduler period (sched_latency: 6 ms × (1 + log2 CPUs), longer
// when more threads are runnable than CPUs: 3 ms each), a CPython engine's
// full garbage collection takes tens of milliseconds. 80 ms, measured: on
// a 2-core VM under load 15–29 (soak-10m.yaml), a 50 ms floor gave up 77
// streams of 4000 whose engine lived, 57 of them sending again within 30
// ms. The router's own lateness is not the engine's and is handled apart
// (Stall). The Ceiling
// bounds what a hang costs a stream whose history holds one long gap (a
// preempted request, a slow step of a CPU engine) for the next 64 tokens: an
// engine slower than that answers its health probe and is given more time
// (Stall.Answer), so the ceiling costs a slow engine a probe, not a resume.
type StallRule struct {
	// Factor scales the stream's longest recent gap (router_stall_factor).
	Factor float64
	// Floor is the shortest window (router_stall_floor_ms).
	Floor time.Duration
	// Ceiling is the longest window (router_stall_ceiling_ms).
	Ceiling time.Duration
	// Cold is the shortest window while the stream has shown fewer than
	// warmGaps gaps (its first tokens), and what an engine that answered its
	// health probe is given at least (router_stall_ms).
	Cold time.Duration
	// FirstToken bounds the wait for a leg's first token: the KV pull and
	// the recompute of a resume's tokens (router_first_token_ms).
	FirstToken time.Duration
}

// DefaultStallRule is the rule connexd's defaults configure (config
// router_stall_*): at 20 ms a token a hang is given up after 80 ms.
var DefaultStallRule = StallRule{
	Factor:     3,                      // room for three of the stream's worst recent gaps in a row
	Floor:      80 * time.Millisecond,  // what a busy host takes from a live engine (above)
	Ceiling:    time.Second,            // a hang costs at most a second before the resume
	Cold:       300 * time.Millisecond, // a stream whose pace is not known yet
	FirstToken: 30 * time.Second,       // a pull of many GiB and the recompute
}

// Check says what is wrong with r, if anything: every duration positive,
// Floor ≤ Cold ≤ Ceiling, Factor ≥ 1.
func (r StallRule) Check() error {
	switch {
	case r.Factor < 1:
		return fmt.Errorf("stall rule: factor %g is below 1: every token would be late", r.Factor)
	case r.Floor <= 0 || r.Cold <= 0 || r.Ceiling <= 0 || r.FirstToken <= 0:
		return fmt.Errorf("stall rule: floor %s, cold %s, ceiling %s and first token %s must all be positive", r.Floor, r.Cold, r.Ceiling, r.FirstToken)
	case r.Floor > r.Cold || r.Cold > r.Ceiling:
		return fmt.Errorf("stall rule: want floor %s ≤ cold window %s ≤ ceiling %s", r.Floor, r.Cold, r.Ceiling)
	}
	return nil
}

// Window is how long a token may take after the previous one, given the
// stream's recent gaps (at most the last gapWindow count).
func (r StallRule) Window(gaps []time.Duration) time.Duration {
	var longest time.Duration
	for _, g := range gaps {
		longest = max(longest, g)
	}
	w := max(r.Floor, time.Duration(r.Factor*float64(longest)))
	if len(gaps) < warmGaps {
		w = max(w, r.Cold)
	}
	return min(w, r.Ceiling)
}

// AliveWindow is how long an engine that answered its health probe but sent
// no token is given from that answer: at least the cold window, because an
// engine that answers is starved or slow, not hung, and moving its stream
// would cost a pull and a recompute that waiting may not.
func (r StallRule) AliveWindow(gaps []time.Duration) time.Duration {
	return max(r.Window(gaps), r.Cold)
}
