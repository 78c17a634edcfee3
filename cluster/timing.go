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
