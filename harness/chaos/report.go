package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is a run's outcome: the counts, what each fault did, the broken
// invariants, and every request's record (written by --report as JSON).
type Report struct {
	Scenario string        `json:"scenario"`
	Seed     int64         `json:"seed"`
	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"duration_ns"`
	Summary
	Faults     []FaultReport `json:"faults"`
	Violations []Violation   `json:"violations"`
	Records    []*Record     `json:"records"`
	// LoadAvg is the machine's load average (1, 5, 15 minutes, from
	// /proc/loadavg) when the load ended: a run that failed on a box busy
	// with other work says so. Empty where /proc is missing.
	LoadAvg string `json:"loadavg,omitempty"`
}

// loadAvg reads the first three fields of /proc/loadavg ("" if it cannot).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// byReason renders counts by reason as ": engine_left 1, stalled 2", by
// reason name; "" when there are none.
func byReason(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	reasons := make([]string, 0, len(m))
	for k := range m {
		reasons = append(reasons, k)
	}
	sort.Strings(reasons)
	parts := make([]string, len(reasons))
	for i, k := range reasons {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return ": " + strings.Join(parts, ", ")
}

// OK reports whether every invariant held.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// WriteJSON writes the report to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("chaos: write report: %w", err)
	}
	return nil
}

// WriteTable writes the human summary: counts, faults, verdict.
func (r *Report) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "scenario\t%s (seed %d, %s)\n", r.Scenario, r.Seed, r.Duration.Round(time.Millisecond))
	fmt.Fprintf(tw, "requests\t%d: %d completed, %d failed with a clear error, %d lost\n", r.Requests, r.Completed, r.Failed, r.Lost)
	fmt.Fprintf(tw, "resumed\t%d (failover p50 %.0f ms, p99 %.0f ms)\n", r.Resumed, r.FailoverMsP50, r.FailoverMsP99)
	if r.FalseResumes >= 0 {
		fmt.Fprintf(tw, "false resumes\t%d (%.2f%% of requests; the old leg showed life after it was given up)%s\n",
			r.FalseResumes, 100*float64(r.FalseResumes)/float64(max(r.Requests, 1)), byReason(r.FalseResumesByReason))
	}
	fmt.Fprintf(tw, "prefills\t%d\n", r.Prefills)
	fmt.Fprintf(tw, "diverged\t%d\n", r.Diverged)
	fmt.Fprintf(tw, "leaked blocks\t%d\n", r.LeakedBlocks)
	fmt.Fprintf(tw, "double frees\t%d\n", r.DoubleFrees)
	if r.LoadAvg != "" {
		fmt.Fprintf(tw, "machine load\t%s (1, 5, 15 min, when the load ended)\n", r.LoadAvg)
	}
	_ = tw.Flush()
	if len(r.Faults) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "AT\tACTION\tTARGET\tHIT\tTOOK\tNOTE")
		for _, f := range r.Faults {
			note := f.Skipped
			if f.Error != "" {
				note = "error: " + f.Error
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", f.At.Round(time.Millisecond), f.Action, f.Target, f.Resolved, f.Took.Round(time.Millisecond), note)
		}
		_ = tw.Flush()
	}
	// The errors clients saw, most frequent first, so a failure is
	// explained without opening the JSON.
	counts := map[string]int{}
	for _, rec := range r.Records {
		if !rec.Completed() {
			counts[rec.Err]++
		}
	}
	if len(counts) > 0 {
		errs := make([]string, 0, len(counts))
		for e := range counts {
			errs = append(errs, e)
		}
		sort.Slice(errs, func(i, j int) bool {
			return counts[errs[i]] > counts[errs[j]] || (counts[errs[i]] == counts[errs[j]] && errs[i] < errs[j])
		})
		fmt.Fprintln(w, "\nerrors clients saw:")
		for i, e := range errs {
			if i == 5 {
				fmt.Fprintf(w, "  … %d other kinds\n", len(errs)-5)
				break
			}
			fmt.Fprintf(w, "  %4d× %s\n", counts[e], e)
		}
	}
	fmt.Fprintln(w)
	if r.OK() {
		fmt.Fprintln(w, "every invariant held: "+strings.Join([]string{InvNothingLost, InvNoSecondPrefill, InvSameAnswer, InvNoLeak, InvExactlyOnceFree}, "; "))
		return
	}
	for _, v := range r.Violations {
		fmt.Fprintln(w, v.String())
	}
}
