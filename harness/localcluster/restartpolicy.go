package localcluster

import "time"

// RestartPolicy says when a process that exited without being asked to
// (a crash, a kill -9, an OOM kill) is started again, as systemd's
// Restart=on-failure or a Kubernetes pod's restartPolicy would. The zero
// value never restarts: the chaos harness and tests that kill processes on
// purpose keep them dead. Defaults are noted on each field.
type RestartPolicy struct {
	// After is the delay before the first restart; 0 turns restarts off.
	After time.Duration
	// Max caps the delay of a process that keeps crashing (default 30 s:
	// a crash loop costs little, and a fixed process is back within it).
	Max time.Duration
	// Stable is how long a process must have run for its next crash to
	// count as a first one again (default 10 s: a process killed by hand
	// a while after it came back gets the short delay; one that dies
	// while starting backs off).
	Stable time.Duration
}

// DefaultRestart is the policy of `make run`: back after 1 s, doubling
// for a process that crashes again within 10 s of its restart, at most
// 30 s.
var DefaultRestart = RestartPolicy{After: time.Second}

// Enabled reports whether the policy restarts anything.
func (p RestartPolicy) Enabled() bool { return p.After > 0 }

func (p RestartPolicy) max() time.Duration {
	if p.Max > 0 {
		return max(p.Max, p.After)
	}
	return max(30*time.Second, p.After)
}

func (p RestartPolicy) stable() time.Duration {
	if p.Stable > 0 {
		return p.Stable
	}
	return 10 * time.Second
}

// Delay is how long to wait before restarting a process that ran for ran
// before it exited, when its previous restart waited prev (0: it never
// was restarted). 0 means do not restart (the policy is off).
func (p RestartPolicy) Delay(prev, ran time.Duration) time.Duration {
	if !p.Enabled() {
		return 0
	}
	if prev <= 0 || ran >= p.stable() {
		return p.After
	}
	return min(2*prev, p.max())
}
