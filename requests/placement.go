package requests

import (
	"sort"
	"time"
)

// Candidate is a live decode member that can adopt requests.
type Candidate struct {
	ID   string
	Load int64 // in-flight requests it reports
}

// Place assigns each orphan to the least-loaded candidate, counting the
// orphans already assigned in this call, ties broken by member id so every
// member computing it from the same view gets the same answer. Orphans are
// placed in id order. With no candidates it returns an empty map.
func Place(orphans []string, candidates []Candidate) map[string]string {
	out := make(map[string]string, len(orphans))
	if len(candidates) == 0 {
		return out
	}
	c := append([]Candidate(nil), candidates...)
	o := append([]string(nil), orphans...)
	sort.Strings(o)
	for _, id := range o {
		best := 0
		for i := 1; i < len(c); i++ {
			if c[i].Load < c[best].Load || (c[i].Load == c[best].Load && c[i].ID < c[best].ID) {
				best = i
			}
		}
		out[id] = c[best].ID
		c[best].Load++
	}
	return out
}

// View is what one member knows about which owners are alive, for deciding
// orphans conservatively: an owner is orphaned only if this member saw it
// leave, or has watched the cluster long enough (Grace, at least one
// failure-detection TTL) to know that an absent owner is not merely unheard
// of yet. A member that just (re)joined and has a partial view therefore
// never steals requests from live members.
type View struct {
	Present  map[string]bool // members in the current view, suspects included
	Departed map[string]bool // members seen leaving and not back since
	Watched  time.Duration   // how long this member has been watching
	Grace    time.Duration   // how long an absent owner must go unheard of
	// Settled lists members that have been in this member's view for at
	// least Grace (this member itself once Watched ≥ Grace): only they
	// may coordinate, since a member that just (re)joined — a zombie back
	// from a pause among them — has a partial view.
	Settled map[string]bool
}

// CoordinatorIn is the settled candidate with the smallest id, or "" if
// none is settled yet (the periodic rescan then tries again).
func CoordinatorIn(cands []Candidate, v View) string {
	best := ""
	for _, c := range cands {
		if v.Settled[c.ID] && (best == "" || c.ID < best) {
			best = c.ID
		}
	}
	return best
}

// Orphaned reports whether owner's requests must move.
func (v View) Orphaned(owner string) bool {
	switch {
	case v.Present[owner]:
		return false
	case v.Departed[owner]:
		return true
	}
	return v.Watched >= v.Grace
}

// OrphansIn lists, sorted, the requests whose owner v says is orphaned.
func OrphansIn(owners map[string]string, v View) []string {
	var out []string
	for req, owner := range owners {
		if v.Orphaned(owner) {
			out = append(out, req)
		}
	}
	sort.Strings(out)
	return out
}
