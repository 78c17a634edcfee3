package router

import "fmt"

// resumeMachine is the router's resume policy for one request's decode
// legs, pure (no I/O, no clock): relay.go's decode loop picks engines,
// sends legs and relays tokens, feeds the machine what happened (Step) and
// does what it answers. It decides what kind of leg goes next (the first,
// a resume from the tokens the client has, or a replay of the whole
// answer), and after each leg whether the request is done, ends with the
// leg's error, resumes elsewhere, turns to replay, or has moved too often.
// The scripts in testdata/resume/ pin every rule.
type resumeMachine struct {
	maxResumes int  // router_max_resumes: legs after the first at most
	resumes    int  // legs after the first so far (and grants refused)
	replay     bool // the request resumes by replay from now on
}

// newResumeMachine is the machine of a request that may move maxResumes
// times.
func newResumeMachine(maxResumes int) *resumeMachine {
	return &resumeMachine{maxResumes: maxResumes}
}

// legKind is what the next decode leg sends.
type legKind int

const (
	legFirst  legKind = iota // the client's request with the hold's params (DecodeBody)
	legPrefix                // a completion of the prompt and the tokens the client has (ResumeBody)
	legReplay                // the client's request again; the relay leaves out what the client has (ReplayBody)
)

func (k legKind) String() string {
	return [...]string{"first", "prefix", "replay"}[k]
}

// Leg is what the next decode leg sends, and how many legs came before it
// (not counting the first).
func (m *resumeMachine) Leg() (legKind, int) {
	switch {
	case m.resumes == 0:
		return legFirst, 0
	case m.replay:
		return legReplay, m.resumes
	}
	return legPrefix, m.resumes
}

// resumeEventKind is what happened.
type resumeEventKind int

const (
	evNoEngine     resumeEventKind = iota // no decode engine left to try
	evGrantRefused                        // the next engine's member refused the router's grant
	evLegEnded                            // a leg ended (resumeEvent.end says how)
)

// resumeEvent is what relay.go tells the machine.
type resumeEvent struct {
	kind resumeEventKind
	end  legEnd // evLegEnded: how the leg ended
	// refusal (evLegEnded, legFailed): why the request cannot resume from
	// the client's tokens (resumeRefusal's reason), "" when it can.
	refusal string
	// replayable (evLegEnded, legFailed): the request may be generated
	// again from its first token (replay.go: greedy, or seeded — by the
	// client or by the router at its first leg).
	replayable bool
	// finished (evLegEnded, legFailed): the client already has the
	// answer's finish (the leg broke after its last token, before its
	// usage or [DONE]): nothing is left to resume.
	finished bool
}

// resumeAction is what relay.go does next.
type resumeAction int

const (
	actNextLeg    resumeAction = iota // pick an engine not tried yet and send Leg()'s leg there
	actDone                           // the answer is complete
	actSwitchBack                     // relay the answer the leg given up before finished
	actClientGone                     // the client left: stop
	actReject                         // end the answer with the leg's error
	actRefuse                         // end it resume_refused: it cannot resume into the same answer
	actFail                           // end it with resumeEffect.code
)

func (a resumeAction) String() string {
	return [...]string{"next-leg", "done", "switch-back", "client-gone", "reject", "refuse", "fail"}[a]
}

// resumeEffect is the machine's answer to an event.
type resumeEffect struct {
	do          resumeAction
	code        string // actFail: the error code (no_engine, resume_failed)
	startReplay bool   // the request turned to replay with this event
	maxed       bool   // actFail after router_max_resumes legs failed
}

// Step takes an event and says what to do.
func (m *resumeMachine) Step(ev resumeEvent) resumeEffect {
	switch ev.kind {
	case evNoEngine:
		if m.resumes == 0 {
			return resumeEffect{do: actFail, code: CodeNoEngine}
		}
		return resumeEffect{do: actFail, code: CodeResumeFailed}
	case evGrantRefused:
		m.resumes++ // an engine tried: the next one is picked among the rest
		return resumeEffect{do: actNextLeg}
	}
	switch ev.end {
	case legDone:
		return resumeEffect{do: actDone}
	case legSwitchBack:
		return resumeEffect{do: actSwitchBack}
	case legClientGone:
		return resumeEffect{do: actClientGone}
	case legRejected:
		return resumeEffect{do: actReject}
	}
	if ev.finished {
		// A resume would ask for no token (length) or go on past the
		// answer's end (stop): the answer is whole.
		return resumeEffect{do: actDone}
	}
	var eff resumeEffect
	if ev.refusal != "" && !m.replay {
		if !ev.replayable {
			return resumeEffect{do: actRefuse}
		}
		m.replay, eff.startReplay = true, true
	}
	if m.resumes >= m.maxResumes {
		return resumeEffect{do: actFail, code: CodeResumeFailed, maxed: true, startReplay: eff.startReplay}
	}
	m.resumes++
	eff.do = actNextLeg
	return eff
}

// Replay says whether the request resumes by replay.
func (m *resumeMachine) Replay() bool { return m.replay }

// String is the machine's state, as the scripts print it.
func (m *resumeMachine) String() string {
	return fmt.Sprintf("resumes=%d replay=%t", m.resumes, m.replay)
}
