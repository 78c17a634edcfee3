package cluster

import (
	"strings"
	"testing"
	"time"
)

func TestTimingHelpers(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		got  time.Duration
		want time.Duration
	}{
		{"suspectAfter 2×50ms", suspectAfter(50*ms, 2), 100 * ms},
		{"suspectAfter 3×200ms", suspectAfter(200*ms, 3), 600 * ms},
		{"deadAfter 20×50ms", deadAfter(50*ms, 20), time.Second},
		{"deadAfter 25×200ms", deadAfter(200*ms, 25), 5 * time.Second},
		{"jittered low end", jittered(100*ms, 0.1, 0), 90 * ms},
		{"jittered middle", jittered(100*ms, 0.1, 0.5), 100 * ms},
		{"jittered near top", jittered(100*ms, 0.1, 0.999999), 110 * ms},
		{"jittered none", jittered(100*ms, 0, 0.7), 100 * ms},
		{"maxHeartbeatGap", maxHeartbeatGap(50*ms, 0.1), 55 * ms},
		{"maxHeartbeatGap no jitter", maxHeartbeatGap(time.Second, 0), time.Second},
	} {
		// Float rounding may cost a nanosecond; a microsecond is plenty.
		if d := tc.got - tc.want; d > time.Microsecond || d < -time.Microsecond {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

func TestPresetsAreValid(t *testing.T) {
	for _, tc := range []struct {
		name         string
		cfg          Config
		suspectAfter time.Duration
		ttl          time.Duration
	}{
		{"local", DefaultLocalConfig(), 100 * time.Millisecond, time.Second},
		{"lan", DefaultLANConfig(), 600 * time.Millisecond, 5 * time.Second},
		{"wan", DefaultWANConfig(), 3 * time.Second, 15 * time.Second},
	} {
		if err := tc.cfg.Validate(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if got := tc.cfg.SuspectAfter(); got != tc.suspectAfter {
			t.Errorf("%s: SuspectAfter = %v, want %v", tc.name, got, tc.suspectAfter)
		}
		if got := tc.cfg.TTL(); got != tc.ttl {
			t.Errorf("%s: TTL = %v, want %v", tc.name, got, tc.ttl)
		}
		if tc.cfg.SubjectPrefix != DefaultSubjectPrefix {
			t.Errorf("%s: prefix %q", tc.name, tc.cfg.SubjectPrefix)
		}
	}
}

func TestValidateRejects(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"empty prefix", func(c *Config) { c.SubjectPrefix = "" }, "subject prefix"},
		{"wildcard prefix", func(c *Config) { c.SubjectPrefix = "connex.>" }, "subject prefix"},
		{"empty token", func(c *Config) { c.SubjectPrefix = "connex..x" }, "subject prefix"},
		{"space in prefix", func(c *Config) { c.SubjectPrefix = "con nex" }, "subject prefix"},
		{"zero interval", func(c *Config) { c.HeartbeatInterval = 0 }, "heartbeat interval"},
		{"negative jitter", func(c *Config) { c.HeartbeatJitter = -0.1 }, "jitter"},
		{"jitter too large", func(c *Config) { c.HeartbeatJitter = 0.5 }, "jitter"},
		{"suspect within one beat", func(c *Config) { c.SuspectMult = 1 }, "heartbeat gap"},
		{"zero probe timeout", func(c *Config) { c.ProbeTimeout = 0 }, "probe timeout"},
		{"ttl before probe ends", func(c *Config) { c.DeadMult = 2 }, "no time to probe"},
	} {
		cfg := DefaultLocalConfig()
		tc.mutate(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to mention %q", tc.name, err, tc.want)
		}
	}
}

// TestActorClusterConfigGossip: protoactor's gossip runs at GossipInterval
// and its heartbeat expiration (which blocks a member for good) stays far
// beyond both the gossip interval and every preset's TTL, so that only the
// Provider decides who is gone.
func TestActorClusterConfigGossip(t *testing.T) {
	c := ActorClusterConfig("c", nil, nil, NewRemoteConfig("127.0.0.1", 0, RemoteOptions{}))
	if c.GossipInterval != GossipInterval {
		t.Fatalf("gossip every %s, want %s", c.GossipInterval, GossipInterval)
	}
	if c.HeartbeatExpiration < 10*c.GossipInterval {
		t.Fatalf("gossip heartbeat expiration %s is under ten gossip intervals (%s)", c.HeartbeatExpiration, c.GossipInterval)
	}
	for name, cfg := range map[string]Config{"local": DefaultLocalConfig(), "lan": DefaultLANConfig(), "wan": DefaultWANConfig()} {
		if c.HeartbeatExpiration <= cfg.TTL() {
			t.Errorf("%s: gossip heartbeat expiration %s is not beyond the TTL %s", name, c.HeartbeatExpiration, cfg.TTL())
		}
	}
}
