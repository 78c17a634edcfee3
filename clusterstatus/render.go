package clusterstatus

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/connex/connex/messages"
)

// Render writes the report as tables: members, engines, holds (oldest
// first: a stranded hold is at the top), requests and pulls.
func Render(w io.Writer, r *Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	age := func(ms int64) string {
		if ms == 0 {
			return "-"
		}
		return r.At.Sub(time.UnixMilli(ms)).Round(time.Millisecond).String()
	}
	in := func(ms int64) string {
		if ms == 0 {
			return "-"
		}
		return time.UnixMilli(ms).Sub(r.At).Round(time.Millisecond).String()
	}
	fmt.Fprintf(tw, "MEMBER\tROLE\tBACKEND\tDATA\tENGINES\tHOLDS\tREQUESTS\tPULLS\tUP\tSEES\n")
	for _, m := range r.Members {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", m.MemberId, m.Role, m.Backend, m.DataAddr,
			len(m.Engines), len(m.Holds), len(m.Requests), len(m.Pulls), age(m.StartedUnixMs), strings.Join(m.ClusterMembers, ","))
	}
	for _, name := range sortedKeys(r.Unanswered) {
		fmt.Fprintf(tw, "%s\t?\t\t\t\t\t\t\t\tno answer: %s\n", name, r.Unanswered[name])
	}
	fmt.Fprintf(tw, "\nENGINE\tMEMBER\tROLE\tMODEL\tIN_FLIGHT\tBLOCKS_FREE\tURL\n")
	for _, m := range r.Members {
		for _, e := range m.Engines {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d/%d\t%s\n", e.EngineId, m.MemberId, e.Role, e.Model, e.InFlight, e.BlocksFree, e.BlocksTotal, e.BaseUrl)
		}
	}
	fmt.Fprintf(tw, "\nHOLD (TRANSFER)\tMEMBER\tENGINE\tSTATE\tBLOCKS\tBYTES\tPULLS\tREADING\tAGE\tEXPIRES_IN\n")
	for _, m := range r.Members {
		for _, h := range m.Holds {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", h.TransferId, m.MemberId, h.EngineId, h.State,
				len(h.BlockIds), h.Bytes, h.PullsDone, h.ActivePulls, age(h.CreatedUnixMs), in(h.ExpiresUnixMs))
		}
	}
	fmt.Fprintf(tw, "\nREQUEST\tOWNER\tENGINE\tEPOCH\tPROMPT\tGENERATED\tTRANSFER\tHOLDER\tRESUMED_BY\tFROM\tUPDATED\n")
	for _, m := range r.Members {
		for _, q := range m.Requests {
			by, from := resumedBy(q)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s ago\n", q.RequestId, q.Owner, q.EngineId, q.Epoch,
				len(q.PromptTokenIds), len(q.GeneratedTokenIds), q.GetParams().GetTransferId(), q.GetParams().GetRemoteCtrl().GetMember(), by, from, age(q.UpdatedUnixMs))
		}
	}
	fmt.Fprintf(tw, "\nPULL\tMEMBER\tENGINE\tTRANSFER\tRUNNING\n")
	for _, m := range r.Members {
		for _, p := range m.Pulls {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.PullId, m.MemberId, p.EngineId, p.TransferId, age(p.StartedUnixMs))
		}
	}
	return tw.Flush()
}

// resumedBy gives a request's RESUMED_BY and FROM columns. A request still
// on the engine it started on (epoch 1) shows "-" in both. A resumed one
// shows who moved it — "router" (the router resent it to another engine) or
// "cluster" (the orphan coordinator adopted it when its owner died) — and
// the members that ran it before, oldest first. resume_authority alone says
// who would resume the request, not that anyone did.
func resumedBy(q *messages.RequestState) (by, from string) {
	prev := q.GetPreviousOwners()
	if q.GetEpoch() <= 1 && len(prev) == 0 {
		return "-", "-"
	}
	by, from = q.GetResumeAuthority(), strings.Join(prev, ",")
	if by == "" {
		by = "cluster"
	}
	if from == "" {
		from = "-"
	}
	return by, from
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
