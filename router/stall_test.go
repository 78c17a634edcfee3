package router

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestStallScripts runs the stall rule's interaction scripts in
// testdata/stall/ with datadriven (a command, "----", the expected output,
// a blank line; # starts a comment). Each file starts at t=0 with no rule.
// Commands:
//
//	rule factor=3 floor=50ms cold=300ms ceiling=1s first=30s
//	start                  (a leg starts now)
//	tokens n=20 every=20ms (n tokens, one every 20 ms from now)
//	token                  (a token now)
//	advance 30ms           (the clock moves; nothing is checked)
//	fire [late=120ms]      (the timer fires at Due, or that much after it;
//	                        never before now)
//	check                  (the timer fires now)
//	answer probe=1 alive=true
//	keep                   (the leg is stalled but cannot move: keep it?)
//	other                  (the engine delivered a token on another leg now)
//	witness                (another engine delivered a token now)
//
// Each prints the time, the window, when the relay's timer is due, the
// deadline, and what a check asked for (probe n, stalled). Run with
// -rewrite after a deliberate change of the rule.
func TestStallScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/stall", func(t *testing.T, path string) {
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		now := t0
		var s *Stall
		var heard Heard // the engine's last token on another leg; another engine's
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			dur := func(key string) time.Duration {
				var raw string
				d.ScanArgs(t, key, &raw)
				v, err := time.ParseDuration(raw)
				if err != nil {
					d.Fatalf(t, "%s: %v", key, err)
				}
				return v
			}
			if d.Cmd != "rule" && s == nil {
				d.Fatalf(t, "%s before rule", d.Cmd)
			}
			var step StallStep
			switch d.Cmd {
			case "rule":
				var factor float64
				d.ScanArgs(t, "factor", &factor)
				r := StallRule{Factor: factor, Floor: dur("floor"), Cold: dur("cold"), Ceiling: dur("ceiling"), FirstToken: dur("first")}
				if err := r.Check(); err != nil {
					return fmt.Sprintf("error: %v\n", err)
				}
				s = &Stall{Rule: r}
				return "ok\n"
			case "start":
				s.Start(now)
			case "tokens":
				var n int
				d.ScanArgs(t, "n", &n)
				every := dur("every")
				for range n {
					now = now.Add(every)
					s.Token(now)
				}
			case "token":
				s.Token(now)
			case "advance":
				if len(d.CmdArgs) != 1 {
					d.Fatalf(t, "advance takes one duration, as in \"advance 30ms\"")
				}
				v, err := time.ParseDuration(d.CmdArgs[0].Key)
				if err != nil {
					d.Fatalf(t, "advance: %v", err)
				}
				now = now.Add(v)
			case "fire":
				var late time.Duration
				if d.HasArg("late") {
					late = dur("late")
				}
				now = later(now, s.Due()).Add(late)
				step = s.Check(now, heard)
			case "check":
				step = s.Check(now, heard)
			case "other":
				heard.Engine = now
			case "witness":
				heard.Others = now
			case "answer":
				var probe int
				var alive bool
				d.ScanArgs(t, "probe", &probe)
				d.ScanArgs(t, "alive", &alive)
				s.Answer(probe, now, alive)
			case "keep":
				if _, kept := s.Keep(now); !kept {
					return fmt.Sprintf("t=%s given up\n", now.Sub(t0))
				}
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			var b strings.Builder
			fmt.Fprintf(&b, "t=%s window=%s due=%s deadline=%s", now.Sub(t0), s.Window(), s.Due().Sub(t0), s.Deadline().Sub(t0))
			if step.Probe != 0 {
				fmt.Fprintf(&b, " probe=%d", step.Probe)
			}
			if step.Stalled {
				b.WriteString(" stalled")
			}
			return b.String() + "\n"
		})
	})
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
