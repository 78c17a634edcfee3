package pull

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/connex/connex/api"
	"github.com/connex/connex/errcode"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// TestPullScripts runs the scripts in testdata/pull/ with datadriven
// against pullMachine, the puller's pure core: each file starts at t=0 with
// no pull. Each case is a command, a line "----", the expected output and
// a blank line; lines starting with # are comments. Commands:
//
//	start stall=3s retain=60s [ask-failed] [reserved=2s]
//	                                         (the first ask went out at t, or could not be sent, or
//	                                         went out that long before t: a reservation's)
//	advance 1s                               (moves the clock; a tick if the machine's wake is due)
//	answer desc [async] | answer no-responders | answer err=expired|unknown_transfer
//	read-done [err=timeout|peer_gone]
//	renewed
//	end-ack [err=region_broken|timeout]
//	cancel | timeout | holder-gone           (the pull's context ended: shutdown, the whole pull's deadline, its holder left)
//
// The output is the effects of the command in order (a done effect shows
// the error's stable code and text), then the phase and when the machine
// next wants a tick. Run with -rewrite (datadriven's flag) to regenerate
// the expected outputs after a deliberate change.
func TestPullScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/pull", func(t *testing.T, path string) {
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		now := t0
		var m *pullMachine
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return runPullCommand(t, d, &m, &now, t0)
		})
	})
}

func runPullCommand(t *testing.T, d *datadriven.TestData, m **pullMachine, now *time.Time, t0 time.Time) string {
	dur := func(key string) time.Duration {
		var s string
		d.ScanArgs(t, key, &s)
		v, err := time.ParseDuration(s)
		if err != nil {
			d.Fatalf(t, "%s: %v", key, err)
		}
		return v
	}
	errArg := func() error {
		var s string
		d.MaybeScanArgs(t, "err", &s)
		switch s {
		case "":
			return nil
		case "expired":
			return api.Errorf(api.CodeExpired, "transfer expired")
		case "unknown_transfer":
			return api.Errorf(api.CodeUnknownTransfer, "no such transfer")
		case "region_broken":
			return api.Errorf(api.CodeRegionBroken, "the holder's region broke")
		case "timeout":
			return api.Errorf(api.CodeTimeout, "no progress")
		case "peer_gone":
			return api.Errorf(api.CodePeerUnavailable, "connection reset")
		}
		d.Fatalf(t, "unknown err=%s", s)
		return nil
	}
	if d.Cmd != "start" && *m == nil {
		d.Fatalf(t, "%s before start", d.Cmd)
	}
	var fx []pullEffect
	switch d.Cmd {
	case "start":
		var askErr error
		if d.HasArg("ask-failed") {
			askErr = nats.ErrConnectionClosed
		}
		var askedAt time.Time
		if d.HasArg("reserved") {
			askedAt = now.Add(-dur("reserved"))
		}
		*m, fx = newPullMachine(*now, pullConfig{ID: "p1", Member: "h1", Stall: dur("stall"), Retain: dur("retain"), AskErr: askErr, Reserved: d.HasArg("reserved"), AskedAt: askedAt})
	case "advance":
		if len(d.CmdArgs) != 1 {
			d.Fatalf(t, "advance DURATION")
		}
		by, err := time.ParseDuration(d.CmdArgs[0].Key)
		if err != nil {
			d.Fatalf(t, "advance: %v", err)
		}
		// Tick at every wake on the way, as the puller's timer would.
		end := now.Add(by)
		for {
			w := (*m).Wake()
			if w.IsZero() || w.After(end) {
				break
			}
			*now = w
			fx = append(fx, (*m).Step(pullTick{Now: *now})...)
			if w2 := (*m).Wake(); !w2.IsZero() && !w2.After(w) {
				d.Fatalf(t, "a tick at its wake %s left the wake at %s: the machine ignores its own deadline", w.Sub(t0), w2.Sub(t0))
			}
		}
		*now = end
	case "answer":
		switch {
		case d.HasArg("desc"):
			fx = (*m).Step(pullAnswer{Now: *now, Desc: &messages.Descriptors{TransferId: "t1", PullEndAsync: d.HasArg("async")}})
		case d.HasArg("no-responders"):
			err := &api.Error{Code: api.CodePeerUnavailable, Msg: "peer.descriptors: no responders", Cause: nats.ErrNoResponders}
			fx = (*m).Step(pullAnswer{Now: *now, Err: err, NoResponders: true})
		default:
			fx = (*m).Step(pullAnswer{Now: *now, Err: errArg()})
		}
	case "read-done":
		fx = (*m).Step(pullReadDone{Now: *now, Err: errArg()})
	case "renewed":
		fx = (*m).Step(pullRenewed{Now: *now})
	case "end-ack":
		fx = (*m).Step(pullEndAck{Now: *now, Err: errArg()})
	case "cancel":
		fx = (*m).Step(pullEnded{Now: *now, Err: context.Canceled})
	case "timeout":
		fx = (*m).Step(pullEnded{Now: *now, Err: context.DeadlineExceeded})
	case "holder-gone":
		fx = (*m).Step(pullEnded{Now: *now, Err: context.Canceled, Gone: &HolderLeftError{Member: "h1", Reason: "timeout"}})
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	var b strings.Builder
	for _, f := range fx {
		fmt.Fprintf(&b, "effect: %s", f.kind)
		switch f.kind {
		case doEndAwait, doEndLater:
			fmt.Fprintf(&b, " ok=%v", f.ok)
		case doDone:
			if f.err == nil {
				b.WriteString(" ok")
			} else {
				fmt.Fprintf(&b, " code=%s err=%q", errcode.Of(f.err).Name(), f.err.Error())
			}
		}
		b.WriteString("\n")
	}
	wake := "none"
	if w := (*m).Wake(); !w.IsZero() {
		wake = w.Sub(t0).String()
	}
	fmt.Fprintf(&b, "t=%s phase=%s wake=%s\n", now.Sub(t0), (*m).Phase(), wake)
	return b.String()
}
