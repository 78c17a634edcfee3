package lease

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestScripts runs the interaction scripts in testdata/ with datadriven:
// each case is a command, a line "----", the expected output and a blank
// line; lines starting with # are comments. Each file starts with no hold
// and the clock at t=0. Commands:
//
//	new retain=60s [mode=after_pull] [owner=p] [consumer=d] [claim=10s]
//	advance 10s             (moves the clock and delivers a Tick)
//	renew [by=d]
//	pull-start id=a [by=d] timeout=5s
//	pull-end id=a [by=d] ok=true|false
//	release [by=d]
//	engine-gone
//	shutdown
//	abort
//	rebind consumer=d2 request=r1 epoch=1
//
// Run with -rewrite (datadriven's flag) to regenerate the expected outputs
// after a deliberate change.
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		now := t0
		var h *Hold
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return runCommand(t, d, &h, &now, t0)
		})
	})
}

// runCommand runs one script command on *h at *now and returns its
// effects, error and the hold's status.
func runCommand(t *testing.T, d *datadriven.TestData, h **Hold, now *time.Time, t0 time.Time) string {
	// str is the value of the optional argument key, or "".
	str := func(key string) string {
		var s string
		d.MaybeScanArgs(t, key, &s)
		return s
	}
	dur := func(key string) time.Duration {
		var v time.Duration
		d.ScanArgs(t, key, &v)
		return v
	}
	var fx []Effect
	var err error
	if d.Cmd != "new" && *h == nil {
		d.Fatalf(t, "%s before new", d.Cmd)
	}
	switch d.Cmd {
	case "new":
		mode := OnFinish
		if m := str("mode"); m != "" {
			if mode, err = ParseMode(m); err != nil {
				d.Fatalf(t, "%v", err)
			}
		}
		var claim time.Duration
		if d.HasArg("claim") {
			claim = dur("claim")
		}
		*h, err = New(*now, Config{Retain: dur("retain"), Mode: mode, Owner: str("owner"), Consumer: str("consumer"), Claim: claim})
		if err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
	case "advance":
		*now = now.Add(advanceBy(t, d))
		fx, err = (*h).Step(Tick{Now: *now})
	case "renew":
		fx, err = (*h).Step(Renew{Now: *now, By: str("by")})
	case "pull-start":
		fx, err = (*h).Step(PullStart{Now: *now, By: str("by"), PullID: str("id"), Deadline: now.Add(dur("timeout"))})
	case "pull-end":
		var ok bool
		d.ScanArgs(t, "ok", &ok)
		fx, err = (*h).Step(PullEnd{Now: *now, By: str("by"), PullID: str("id"), OK: ok})
	case "release":
		fx, err = (*h).Step(Release{Now: *now, By: str("by")})
	case "engine-gone":
		fx, err = (*h).Step(EngineGoneEvent{Now: *now})
	case "shutdown":
		fx, err = (*h).Step(Shutdown{Now: *now})
	case "abort":
		fx, err = (*h).Step(Abort{Now: *now})
	case "rebind":
		var epoch uint64
		d.ScanArgs(t, "epoch", &epoch)
		fx, err = (*h).Step(Rebind{Now: *now, Consumer: str("consumer"), Request: str("request"), Epoch: epoch})
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	var b strings.Builder
	for _, e := range fx {
		switch e := e.(type) {
		case Deregister:
			b.WriteString("effect: deregister\n")
		case Free:
			fmt.Fprintf(&b, "effect: free reason=%s notify=%v\n", e.Reason, e.Notify)
		case PullAbandoned:
			fmt.Fprintf(&b, "effect: pull-abandoned id=%s\n", e.PullID)
		case BeginRead:
			fmt.Fprintf(&b, "effect: begin-read id=%s\n", e.PullID)
		case EndRead:
			fmt.Fprintf(&b, "effect: end-read id=%s\n", e.PullID)
		default:
			d.Fatalf(t, "unknown effect %T", e)
		}
	}
	if err != nil {
		fmt.Fprintf(&b, "error: %v\n", err)
	}
	st := (*h).Status()
	fmt.Fprintf(&b, "t=%s state=%s pulls=%d done=%d freed=%v", now.Sub(t0), st.State, st.ActivePulls, st.PullsDone, st.Freed)
	if at, ok := (*h).NextWake(); ok {
		fmt.Fprintf(&b, " wake=%s", at.Sub(t0))
	}
	b.WriteString("\n")
	return b.String()
}

// advanceBy is the duration of "advance 10s": its one argument, a key
// without a value.
func advanceBy(t *testing.T, d *datadriven.TestData) time.Duration {
	if len(d.CmdArgs) != 1 || len(d.CmdArgs[0].Vals) != 0 {
		d.Fatalf(t, "advance takes one duration, as in \"advance 10s\"")
	}
	v, err := time.ParseDuration(d.CmdArgs[0].Key)
	if err != nil {
		d.Fatalf(t, "advance: %v", err)
	}
	return v
}
