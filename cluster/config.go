package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/connex/connex/natssubject"
)

// DefaultSubjectPrefix is the NATS subject prefix membership traffic uses
// unless Config.SubjectPrefix says otherwise.
const DefaultSubjectPrefix = "connex.cluster"

// Config is the membership and failure-detection configuration of a
// Provider. Start from DefaultLocalConfig, DefaultLANConfig or
// DefaultWANConfig, set Role, and change only what you must.
//
// A member that stops heartbeating is suspected after SuspectAfter() and
// probed; a probe that finds its NATS connection gone removes it at once
// (a crashed process), a probe that times out leaves it suspected until it
// has been silent for TTL() (a hung process), and then it is removed.
type Config struct {
	// SubjectPrefix is the first tokens of every membership subject.
	SubjectPrefix string
	// Role is what this member does: RolePrefill, RoleDecode or RoleRouter.
	Role Role
	// Name is this member's connexd name (the member_id config key), sent
	// in every announce so peers can address its subject API.
	Name string
	// HeartbeatInterval is how often a member announces itself.
	HeartbeatInterval time.Duration
	// HeartbeatJitter randomises each interval by ± this fraction so that
	// members do not beat in lockstep. 0 ≤ HeartbeatJitter < 0.5.
	HeartbeatJitter float64
	// IdleHeartbeatInterval is how often a member announces itself once it
	// has had no work in hand (Activity, and no load) for a TTL: an idle
	// cluster then costs its NATS server a fraction of the messages. Each
	// heartbeat says which interval its sender keeps, and peers suspect an
	// idle member after SuspectMult of its idle beats (at most TTL/2), so
	// an idle member that dies or hangs is found later than a busy one:
	// within about TTL/2 instead of SuspectAfter; the TTL is the same. A
	// member turning busy beats at HeartbeatInterval at once. 0 keeps
	// HeartbeatInterval always. Must not be shorter than
	// HeartbeatInterval, and one jittered idle gap must be shorter than
	// TTL/2.
	IdleHeartbeatInterval time.Duration
	// SuspectMult: a member silent for SuspectMult × HeartbeatInterval is
	// suspected and probed. Must leave room for one jittered interval. A
	// member whose recent heartbeats came late is given SuspectMult × its
	// longest recent gap instead, at most TTL/2; silence excludes the
	// observer's own lag (doc.go, "Failure detection").
	SuspectMult int
	// ProbeTimeout is how long a liveness probe waits for the answer. A
	// suspected member is probed again at most once per HeartbeatInterval
	// after the previous probe ended.
	ProbeTimeout time.Duration
	// DeadMult: a member silent for DeadMult × HeartbeatInterval (the TTL)
	// is removed even though no probe proved it gone.
	DeadMult int
	// Activity is where the member's work is recorded (Activity.Touch), so
	// that it heartbeats at IdleHeartbeatInterval only when it has none.
	// Nil: only its load (SetLoad) counts as work.
	Activity *Activity
	// Logger receives membership changes at Info and protocol noise at
	// Debug. Nil discards everything.
	Logger *slog.Logger
}

// DefaultLocalConfig is for members on one machine (tests, the chaos
// harness, a single box): a SIGKILLed member with work in hand is removed
// within about 100 ms (an idle one within about 550 ms), a hung one after
// its 1 s TTL.
func DefaultLocalConfig() Config {
	return Config{
		SubjectPrefix:         DefaultSubjectPrefix,
		HeartbeatInterval:     50 * time.Millisecond,  // announce 20 times a second
		IdleHeartbeatInterval: 400 * time.Millisecond, // 2.5 a second after a second without work
		HeartbeatJitter:       0.1,                    // each interval is 45–55 ms (idle: 360–440 ms)
		SuspectMult:           2,                      // probe after 100 ms of silence (idle: 500 ms)
		ProbeTimeout:          50 * time.Millisecond,  // a live local member answers in well under 1 ms
		DeadMult:              20,                     // TTL: remove after 1 s of silence
	}
}

// DefaultLANConfig is for members in one data centre: a crashed member
// with work in hand is removed within about 600 ms (an idle one within
// about 2.7 s), a hung one after its 5 s TTL, and a stop-the-world pause
// of a few seconds is survived.
func DefaultLANConfig() Config {
	return Config{
		SubjectPrefix:         DefaultSubjectPrefix,
		HeartbeatInterval:     200 * time.Millisecond, // announce 5 times a second
		IdleHeartbeatInterval: time.Second,            // once a second after 5 s without work
		HeartbeatJitter:       0.1,                    // each interval is 180–220 ms (idle: 0.9–1.1 s)
		SuspectMult:           3,                      // probe after 600 ms of silence (idle: 2.5 s)
		ProbeTimeout:          200 * time.Millisecond, // generous for a LAN round trip through NATS
		DeadMult:              25,                     // TTL: remove after 5 s of silence
	}
}

// DefaultWANConfig is for members spread across regions that share one
// NATS super-cluster: slow, tolerant of lossy links and long pauses.
func DefaultWANConfig() Config {
	return Config{
		SubjectPrefix:     DefaultSubjectPrefix,
		HeartbeatInterval: time.Second, // announce once a second
		HeartbeatJitter:   0.2,         // each interval is 0.8–1.2 s
		SuspectMult:       3,           // probe after 3 s of silence
		ProbeTimeout:      time.Second, // cross-region round trip plus queuing
		DeadMult:          15,          // TTL: remove after 15 s of silence
	}
}

// SuspectAfter is the silence after which a member is suspected and probed.
func (c Config) SuspectAfter() time.Duration {
	return suspectAfter(c.HeartbeatInterval, c.SuspectMult)
}

// TTL is the silence after which a member is removed although no probe
// proved it gone: the hang-detection time.
func (c Config) TTL() time.Duration {
	return deadAfter(c.HeartbeatInterval, c.DeadMult)
}

// SettleAfter is how long a member must have watched the cluster (or
// another member must have been in its view) before an absence means
// "gone" rather than "not heard of yet": one TTL plus two heartbeats, so
// that every live member has announced itself at least once. Sightings
// uses it as its grace.
func (c Config) SettleAfter() time.Duration {
	return c.TTL() + 2*c.HeartbeatInterval
}

// Validate reports the first setting that would make failure detection
// wrong: a member suspected between two of its own heartbeats, or removed
// before it could be probed.
func (c Config) Validate() error {
	switch {
	case !validSubjectPrefix(c.SubjectPrefix):
		return fmt.Errorf("cluster config: subject prefix %q is not a NATS subject", c.SubjectPrefix)
	case c.HeartbeatInterval <= 0:
		return errors.New("cluster config: heartbeat interval must be positive")
	case c.HeartbeatJitter < 0 || c.HeartbeatJitter >= 0.5:
		return fmt.Errorf("cluster config: heartbeat jitter %v outside [0, 0.5)", c.HeartbeatJitter)
	case c.SuspectAfter() <= maxHeartbeatGap(c.HeartbeatInterval, c.HeartbeatJitter):
		return fmt.Errorf("cluster config: suspect after %v is not longer than the longest heartbeat gap %v",
			c.SuspectAfter(), maxHeartbeatGap(c.HeartbeatInterval, c.HeartbeatJitter))
	case c.ProbeTimeout <= 0:
		return errors.New("cluster config: probe timeout must be positive")
	case c.TTL() < c.SuspectAfter()+c.ProbeTimeout:
		return fmt.Errorf("cluster config: TTL %v leaves no time to probe (suspect after %v + probe timeout %v)",
			c.TTL(), c.SuspectAfter(), c.ProbeTimeout)
	case c.IdleHeartbeatInterval < 0:
		return errors.New("cluster config: idle heartbeat interval must not be negative (0: none)")
	case c.IdleHeartbeatInterval > 0 && c.IdleHeartbeatInterval < c.HeartbeatInterval:
		return fmt.Errorf("cluster config: idle heartbeat interval %v is shorter than the heartbeat interval %v",
			c.IdleHeartbeatInterval, c.HeartbeatInterval)
	case c.IdleHeartbeatInterval > 0 && maxHeartbeatGap(c.IdleHeartbeatInterval, c.HeartbeatJitter) >= c.TTL()/2:
		return fmt.Errorf("cluster config: idle heartbeat interval %v (gaps up to %v) leaves no room under half the TTL %v: peers would suspect an idle member between two of its heartbeats",
			c.IdleHeartbeatInterval, maxHeartbeatGap(c.IdleHeartbeatInterval, c.HeartbeatJitter), c.TTL()/2)
	}
	return nil
}

// idleAfter is how long a member goes without work in hand before it
// heartbeats at IdleHeartbeatInterval: one TTL, so that a burst's last
// request is long settled (its member found dead, resumed or finished)
// before anyone's detection slows.
func (c Config) idleAfter() time.Duration { return c.TTL() }

func (c Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

// validSubjectPrefix accepts dot-separated tokens without wildcards or
// spaces, so that the prefix cannot widen a subscription.
func validSubjectPrefix(p string) bool {
	if p == "" {
		return false
	}
	for _, tok := range strings.Split(p, ".") {
		if !natssubject.ValidToken(tok) {
			return false
		}
	}
	return true
}
