package cluster

import "time"

// suspectAfter is the silence after which a member is probed: mult missed
// heartbeats.
func suspectAfter(interval time.Duration, mult int) time.Duration {
	return time.Duration(mult) * interval
}

// deadAfter is the TTL: the silence after which a member is removed without
// proof that it is gone.
func deadAfter(interval time.Duration, mult int) time.Duration {
	return time.Duration(mult) * interval
}

// jittered spreads base by ±frac using r, a uniform number in [0, 1):
// r = 0 gives base×(1−frac), r → 1 gives base×(1+frac).
func jittered(base time.Duration, frac, r float64) time.Duration {
	return time.Duration(float64(base) * (1 - frac + 2*frac*r))
}

// maxHeartbeatGap is the longest a live member can go between two
// heartbeats: one interval at its jittered maximum.
func maxHeartbeatGap(interval time.Duration, frac float64) time.Duration {
	return time.Duration(float64(interval) * (1 + frac))
}

// suspicionTimeout is the silence after which a member is suspected: mult
// of its own heartbeats, each as long as longestGap (the longest of its
// recent heartbeat gaps, our own lag excluded), so that a member beating
// late because it is CPU-starved is given room in proportion; never less
// than base (Config.SuspectAfter) nor more than ceiling (suspectCap).
func suspicionTimeout(base time.Duration, mult int, longestGap, ceiling time.Duration) time.Duration {
	return min(ceiling, max(base, time.Duration(mult)*longestGap))
}

// suspectCap is the most a member's own lag may stretch its suspicion:
// half the TTL, so a member beating late is still probed well before it
// could time out, and never below base.
func suspectCap(base, ttl time.Duration) time.Duration {
	return max(base, ttl/2)
}

// gapWindowSize is how many recent heartbeat gaps a member's suspicion
// timeout looks at: under a second on the local preset, so a member that
// stops lagging is held to the base timeout again soon.
const gapWindowSize = 16

// gapWindow keeps a member's last gapWindowSize heartbeat gaps.
type gapWindow struct {
	gaps [gapWindowSize]time.Duration
	next int
}

func (w *gapWindow) add(d time.Duration) {
	w.gaps[w.next] = d
	w.next = (w.next + 1) % gapWindowSize
}

// longest is the longest recent gap (0 before the second heartbeat).
func (w *gapWindow) longest() time.Duration {
	var m time.Duration
	for _, d := range w.gaps {
		m = max(m, d)
	}
	return m
}
