package router

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestResumeScripts runs the resume policy's scripts in testdata/resume/
// with datadriven (a command, "----", the expected output, a blank line; #
// starts a comment). Each file starts with no machine. Commands:
//
//	machine max=2                   (a request that may move twice)
//	leg                             (what the next leg sends)
//	no-engine                       (no decode engine left to try)
//	grant-refused                   (the next engine's member refused the grant)
//	ended failed [refusal=tools] [replayable=true] [finished=true]
//	                                (a leg ended: done, switch-back, client-gone, rejected or failed;
//	                                 refusal: why it cannot resume from the client's tokens;
//	                                 replayable: it may be generated again, greedy or seeded;
//	                                 finished: the client has the answer's finish already)
//
// Each prints what relay.go does next and the machine's state. Run with
// -rewrite after a deliberate change of the policy.
func TestResumeScripts(t *testing.T) {
	ends := map[string]legEnd{"done": legDone, "switch-back": legSwitchBack, "client-gone": legClientGone, "rejected": legRejected, "failed": legFailed}
	datadriven.Walk(t, "testdata/resume", func(t *testing.T, path string) {
		var m *resumeMachine
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "machine" && m == nil {
				d.Fatalf(t, "%s before machine", d.Cmd)
			}
			var eff resumeEffect
			switch d.Cmd {
			case "machine":
				var max int
				d.ScanArgs(t, "max", &max)
				m = newResumeMachine(max)
				return m.String() + "\n"
			case "leg":
				kind, n := m.Leg()
				return fmt.Sprintf("%s leg after %d resumes\n", kind, n)
			case "no-engine":
				eff = m.Step(resumeEvent{kind: evNoEngine})
			case "grant-refused":
				eff = m.Step(resumeEvent{kind: evGrantRefused})
			case "ended":
				if len(d.CmdArgs) == 0 {
					d.Fatalf(t, "ended needs how: done, switch-back, client-gone, rejected or failed")
				}
				end, ok := ends[d.CmdArgs[0].Key]
				if !ok {
					d.Fatalf(t, "ended %s: want done, switch-back, client-gone, rejected or failed", d.CmdArgs[0].Key)
				}
				var refusal string
				var replayable bool
				if d.HasArg("refusal") {
					d.ScanArgs(t, "refusal", &refusal)
				}
				if d.HasArg("replayable") {
					d.ScanArgs(t, "replayable", &replayable)
				}
				var finished bool
				if d.HasArg("finished") {
					d.ScanArgs(t, "finished", &finished)
				}
				eff = m.Step(resumeEvent{kind: evLegEnded, end: end, refusal: refusal, replayable: replayable, finished: finished})
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			out := []string{eff.do.String()}
			if eff.code != "" {
				out = append(out, "code="+eff.code)
			}
			if eff.startReplay {
				out = append(out, "start-replay")
			}
			if eff.maxed {
				out = append(out, "max-resumes")
			}
			return strings.Join(out, " ") + "; " + m.String() + "\n"
		})
	})
}
