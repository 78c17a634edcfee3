package localcluster

import (
	"testing"
	"time"
)

func TestRestartPolicyDelay(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name      string
		p         RestartPolicy
		prev, ran time.Duration
		want      time.Duration
	}{
		{"off", RestartPolicy{}, 0, time.Hour, 0},
		{"off after a restart", RestartPolicy{}, s, 0, 0},
		{"first crash", DefaultRestart, 0, 0, s},
		{"first crash after a long run", DefaultRestart, 0, time.Hour, s},
		{"crashed again soon: doubles", DefaultRestart, s, 2 * s, 2 * s},
		{"and again", DefaultRestart, 8 * s, 0, 16 * s},
		{"capped at 30 s by default", DefaultRestart, 16 * s, 0, 30 * s},
		{"stays capped", DefaultRestart, 30 * s, 0, 30 * s},
		{"ran 10 s: reset", DefaultRestart, 30 * s, 10 * s, s},
		{"ran just under 10 s: no reset", DefaultRestart, 4 * s, 10*s - 1, 8 * s},
		{"own cap", RestartPolicy{After: 100 * time.Millisecond, Max: 300 * time.Millisecond}, 200 * time.Millisecond, 0, 300 * time.Millisecond},
		{"cap below the first delay is the first delay", RestartPolicy{After: 5 * s, Max: s}, 5 * s, 0, 5 * s},
		{"own reset", RestartPolicy{After: s, Stable: time.Minute}, 2 * s, 30 * s, 4 * s},
		{"own reset reached", RestartPolicy{After: s, Stable: time.Minute}, 2 * s, time.Minute, s},
	} {
		if got := tc.p.Delay(tc.prev, tc.ran); got != tc.want {
			t.Errorf("%s: %+v.Delay(prev %s, ran %s) = %s, want %s", tc.name, tc.p, tc.prev, tc.ran, got, tc.want)
		}
	}
	if (RestartPolicy{}).Enabled() || !DefaultRestart.Enabled() {
		t.Error("Enabled: the zero policy is off, DefaultRestart on")
	}
}
