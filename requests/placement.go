package requests

import "sort"

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

// Coordinator is the member that places orphans: the smallest live decode
// member id. Every member can tell whether it is the one; if it dies the
// next smallest takes over at the next membership change or scan.
func Coordinator(live []string) string {
	if len(live) == 0 {
		return ""
	}
	min := live[0]
	for _, id := range live[1:] {
		if id < min {
			min = id
		}
	}
	return min
}

// Orphans lists requests whose owner is not among the live members.
func Orphans(owners map[string]string, live []string) []string {
	alive := make(map[string]bool, len(live))
	for _, id := range live {
		alive[id] = true
	}
	var out []string
	for req, owner := range owners {
		if !alive[owner] {
			out = append(out, req)
		}
	}
	sort.Strings(out)
	return out
}
