package chaos

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// The invariants of ../shared/BRIEF.md the harness checks, by name (a
// Violation names one).
const (
	InvNothingLost     = "nothing lost"
	InvNoSecondPrefill = "no second prefill while the hold was alive"
	InvSameAnswer      = "outputs equal the uninterrupted reference"
	InvNoLeak          = "no leaked prefill blocks after quiescence plus retain_s"
	InvExactlyOnceFree = "exactly-once free"
	// InvNoErrors is Expect.NoErrors broken: a scenario check, not an
	// invariant of every run.
	InvNoErrors = "every request completes (expect.no_errors)"
	// InvNoResumes is Expect.NoResumes broken: a scenario check.
	InvNoResumes = "no request resumed (expect.no_resumes)"
	// InvFalseStalls is Expect.FalseStallsMaxPct broken: a scenario check.
	InvFalseStalls = "few streams of live engines given up for a stall (expect.false_stalls_max_pct)"
	// InvFaultsApplied: a fault the scenario asked for could not be
	// applied (a restart that failed, a target that would not take it),
	// so the run did not test what the scenario says.
	InvFaultsApplied = "every fault applied"
	// InvInTime: the run reached its timeout before the load and the
	// checks after it were done; the leak and free checks were not made.
	InvInTime = "the run ends within the scenario's timeout"
)

// Violation is one broken invariant: which, the requests (or transfers)
// it concerns, and what differed.
type Violation struct {
	Invariant string   `json:"invariant"`
	Requests  []string `json:"requests,omitempty"`
	Detail    string   `json:"detail"`
}

// String formats the violation as the report and the log print it.
func (v Violation) String() string {
	s := "invariant broken: " + v.Invariant + ": " + v.Detail
	if len(v.Requests) > 0 {
		ids := v.Requests
		if len(ids) > 8 {
			ids = append(append([]string(nil), ids[:8]...), fmt.Sprintf("… %d more", len(v.Requests)-8))
		}
		s += " [" + strings.Join(ids, ", ") + "]"
	}
	return s
}

// refKey names a reference answer: a prompt, as a completion or a chat.
type refKey struct {
	prompt int
	chat   bool
}

// faultWindow is a time a fault took a node down (killed, stopped or cut
// off): a prefill node's holds may die with it (a second prefill is then
// allowed), and while the router is down clients cannot reach it.
type faultWindow struct {
	node       string // "prefill-0", …
	from, till time.Duration
}

// Evidence is everything the checks look at, gathered by the harness.
type Evidence struct {
	Records   []*Record
	Reference map[refKey]string
	// Down are the windows in which a prefill node (engine or connexd) or
	// the router was faulted: a request whose hold lived on that prefill
	// node may be prefilled again; a request whose connection to the router
	// failed while it was down failed visibly (the client's connection was
	// refused or cut), it was not lost.
	Down []faultWindow
	// Freed counts BlocksFreed notices by transfer id.
	Freed map[string]int
	// Live are the holds still alive on prefill members after quiescence
	// plus retain_s: transfer id → blocks.
	Live map[string]uint32
	// DoubleFrees sums connex_double_frees_total of the connexd processes
	// alive at the end (by member).
	DoubleFrees map[string]int
	// RouterPrefills is how many prefill legs the router sent during the
	// load (connex_router_prefills_total before and after); -1 when unknown
	// (the router was restarted, or a prefill node faulted: retries count).
	RouterPrefills int
	// FalseResumes is how many resumes the router counted false during the
	// run (connex_router_false_resumes_total before and after), by the
	// resume's reason; nil when unknown (the router was restarted).
	FalseResumes map[string]int
	// Expect is what the scenario demands beyond the invariants.
	Expect Expect
	// Faults are the faults as they were applied (FaultReport.Error set
	// for one that could not be).
	Faults []FaultReport
	// OutOfTime: the scenario's timeout ended the run before quiescence
	// or the reads after it; Live and DoubleFrees may be missing.
	OutOfTime bool
}

func label(r *Record) string {
	if r.RequestID != "" {
		return r.RequestID
	}
	return fmt.Sprintf("#%d", r.N)
}

// Check evaluates every invariant; none broken means the run passed.
func Check(ev Evidence) []Violation {
	var out []Violation
	var lost, diverged, second []string
	var lostWhy, divergedWhy, secondWhy string
	for _, r := range ev.Records {
		switch {
		case r.Lost && r.Transport && routerDown(r, ev.Down):
			continue // failed visibly: the router was down
		case r.Lost:
			lost = append(lost, label(r))
			if lostWhy == "" {
				lostWhy = fmt.Sprintf("request %s: %s", label(r), r.Err)
			}
			continue
		case !r.Completed():
			if strings.TrimSpace(r.Err) == "" {
				lost = append(lost, label(r))
			}
			continue
		}
		if want, ok := ev.Reference[refKey{r.Prompt, r.Chat}]; ok && r.Text != want {
			diverged = append(diverged, label(r))
			if divergedWhy == "" {
				divergedWhy = describeDiff(r, want)
			}
		}
		if r.Prefills > 1 && !prefillExcused(r, ev.Down) {
			second = append(second, label(r))
			if secondWhy == "" {
				secondWhy = fmt.Sprintf("request %s was prefilled %d times (kv_load %q, %d resumes, decode engines %v) while its prefill engine %s was never faulted", label(r), r.Prefills, r.KVLoad, r.Resumes, r.DecodeEngines, r.PrefillEngine)
			}
		}
	}
	if len(lost) > 0 {
		out = append(out, Violation{InvNothingLost, lost, fmt.Sprintf("%d request(s) got neither an answer nor an error a client can act on; first: %s", len(lost), lostWhy)})
	}
	if len(second) > 0 {
		out = append(out, Violation{InvNoSecondPrefill, second, fmt.Sprintf("%d request(s); first: %s", len(second), secondWhy)})
	} else if ev.RouterPrefills > len(ev.Records) {
		// Requests that failed carry no connex record; the router's own
		// count still shows a prefill leg too many.
		var failed []string
		for _, r := range ev.Records {
			if !r.Completed() {
				failed = append(failed, label(r))
			}
		}
		out = append(out, Violation{InvNoSecondPrefill, failed, fmt.Sprintf("the router sent %d prefill legs for %d requests while no prefill node was faulted (the requests that failed are listed)", ev.RouterPrefills, len(ev.Records))})
	}
	if len(diverged) > 0 {
		out = append(out, Violation{InvSameAnswer, diverged, fmt.Sprintf("%d completed request(s) differ from the uninterrupted answer; first: %s", len(diverged), divergedWhy)})
	}
	var twice []string
	for id, n := range ev.Freed {
		if n > 1 {
			twice = append(twice, fmt.Sprintf("%s (freed %d times)", id, n))
		}
	}
	sort.Strings(twice)
	var df []string
	for m, n := range ev.DoubleFrees {
		if n > 0 {
			df = append(df, fmt.Sprintf("%s: %d", m, n))
		}
	}
	sort.Strings(df)
	if len(twice) > 0 || len(df) > 0 {
		detail := ""
		if len(twice) > 0 {
			detail = fmt.Sprintf("%d transfer(s) announced blocks.freed more than once", len(twice))
		}
		if len(df) > 0 {
			if detail != "" {
				detail += "; "
			}
			detail += "connex_double_frees_total above 0 on " + strings.Join(df, ", ")
		}
		out = append(out, Violation{InvExactlyOnceFree, twice, detail})
	}
	if len(ev.Live) > 0 {
		var ids []string
		var blocks uint32
		for id, b := range ev.Live {
			ids = append(ids, id)
			blocks += b
		}
		sort.Strings(ids)
		out = append(out, Violation{InvNoLeak, ids, fmt.Sprintf("%d hold(s) with %d block(s) still alive on prefill members after quiescence plus retain_s", len(ids), blocks)})
	}
	return append(out, checkExpect(ev)...)
}

// checkExpect evaluates Evidence.Expect: with every engine alive (a
// saturated box, no faults) an error answer or a resume means a live member
// was taken for dead or stalled.
func checkExpect(ev Evidence) []Violation {
	var out []Violation
	if ev.Expect.NoErrors {
		var failed []string
		byErr := map[string]int{}
		for _, r := range ev.Records {
			if !r.Completed() {
				failed = append(failed, label(r))
				byErr[r.Err]++
			}
		}
		if len(failed) > 0 {
			errs := make([]string, 0, len(byErr))
			for e, n := range byErr {
				errs = append(errs, fmt.Sprintf("%d× %s", n, e))
			}
			sort.Strings(errs)
			out = append(out, Violation{InvNoErrors, failed, fmt.Sprintf("%d request(s) failed: %s", len(failed), strings.Join(errs, "; "))})
		}
	}
	if ev.Expect.NoResumes {
		var resumed []string
		for _, r := range ev.Records {
			if r.Resumes > 0 {
				resumed = append(resumed, label(r))
			}
		}
		if len(resumed) > 0 {
			out = append(out, Violation{InvNoResumes, resumed, fmt.Sprintf("%d request(s) were moved to another decode engine although no engine was faulted", len(resumed))})
		}
	}
	var failed []string
	for _, f := range ev.Faults {
		if f.Error != "" {
			failed = append(failed, fmt.Sprintf("%s %s at %s: %s", f.Action, f.Target, f.At.Round(time.Millisecond), f.Error))
		}
	}
	if len(failed) > 0 {
		out = append(out, Violation{InvFaultsApplied, nil, strings.Join(failed, "; ")})
	}
	if ev.OutOfTime {
		out = append(out, Violation{InvInTime, nil, "the timeout came before the load ended and the cluster was quiet: requests never sent are listed as such, leaks and frees were not checked"})
	}
	if ev.Expect.FalseStallsMaxPct != nil {
		limit := *ev.Expect.FalseStallsMaxPct
		n, reqs := ev.FalseResumes["stalled"], max(len(ev.Records), 1)
		switch {
		case ev.FalseResumes == nil:
			out = append(out, Violation{InvFalseStalls, nil, "the router's false resumes could not be read (was it restarted?)"})
		case 100*float64(n)/float64(reqs) > limit:
			out = append(out, Violation{InvFalseStalls, nil, fmt.Sprintf("%d of %d requests (%.2f%%, more than %g%%) were moved off a live engine for a stall; the machine's load says whether the host starved the engines",
				n, reqs, 100*float64(n)/float64(reqs), limit)})
		}
	}
	return out
}

// prefillExcused reports whether r's prefill node was faulted while r ran:
// its hold may have died with it, and a second prefill is then allowed.
func prefillExcused(r *Record, down []faultWindow) bool {
	for _, w := range down {
		if w.node != "router" && (r.PrefillEngine == "" || w.node == r.PrefillEngine) && w.from <= r.End && w.till >= r.Start {
			return true
		}
	}
	return false
}

// routerDown reports whether the router was faulted while r ran (a slack
// of a second covers the connection noticing).
func routerDown(r *Record, down []faultWindow) bool {
	for _, w := range down {
		if w.node == "router" && w.from <= r.End && w.till+time.Second >= r.Start {
			return true
		}
	}
	return false
}

func describeDiff(r *Record, want string) string {
	got := r.Text
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	ctx := func(s string) string {
		lo, hi := max(0, i-16), min(len(s), i+24)
		return fmt.Sprintf("%q", s[lo:hi])
	}
	return fmt.Sprintf("request %s (prompt %d, %d resumes, decode engines %v): %d bytes vs the reference's %d, first difference at byte %d: got …%s…, want …%s…",
		label(r), r.Prompt, r.Resumes, r.DecodeEngines, len(got), len(want), i, ctx(got), ctx(want))
}

// Summary counts what a run did.
type Summary struct {
	Requests      int     `json:"requests"`
	Completed     int     `json:"completed"`
	Failed        int     `json:"failed"`
	Lost          int     `json:"lost"`
	Resumed       int     `json:"resumed"`
	Prefills      int     `json:"prefills"`
	Diverged      int     `json:"diverged"`
	LeakedBlocks  uint32  `json:"leaked_blocks"`
	DoubleFrees   int     `json:"double_frees"`
	FailoverMsP50 float64 `json:"failover_ms_p50"`
	FailoverMsP99 float64 `json:"failover_ms_p99"`
	// FalseResumes counts resumes whose old decode leg showed life after
	// the router gave it up (the router's connex_router_false_resumes_total
	// over the run); -1 when unknown (the router was restarted).
	FalseResumes int `json:"false_resumes"`
	// FalseResumesByReason splits FalseResumes by why the leg was given up
	// (stalled, engine_left, …).
	FalseResumesByReason map[string]int `json:"false_resumes_by_reason,omitempty"`
}

// Summarize counts the evidence. The failover time of a resumed streamed
// request is its longest pause between two chunks (MaxGap).
func Summarize(ev Evidence) Summary {
	s := Summary{Requests: len(ev.Records), FalseResumes: -1}
	if ev.FalseResumes != nil {
		s.FalseResumes, s.FalseResumesByReason = 0, ev.FalseResumes
		for _, n := range ev.FalseResumes {
			s.FalseResumes += n
		}
	}
	var failovers []float64
	for _, r := range ev.Records {
		switch {
		case r.Lost && !(r.Transport && routerDown(r, ev.Down)):
			s.Lost++
		case r.Completed():
			s.Completed++
		default:
			s.Failed++
		}
		s.Prefills += max(r.Prefills, 0)
		if r.Resumes > 0 {
			s.Resumed++
			if r.Stream && r.MaxGap > 0 {
				failovers = append(failovers, float64(r.MaxGap)/float64(time.Millisecond))
			}
		}
		if want, ok := ev.Reference[refKey{r.Prompt, r.Chat}]; ok && r.Completed() && r.Text != want {
			s.Diverged++
		}
	}
	for _, b := range ev.Live {
		s.LeakedBlocks += b
	}
	for _, n := range ev.Freed {
		if n > 1 {
			s.DoubleFrees += n - 1
		}
	}
	for _, n := range ev.DoubleFrees {
		s.DoubleFrees += n
	}
	if len(failovers) > 0 {
		sort.Float64s(failovers)
		s.FailoverMsP50 = failovers[len(failovers)/2]
		s.FailoverMsP99 = failovers[min(len(failovers)-1, len(failovers)*99/100)]
	}
	return s
}
