package requests

import (
	"sort"
	"time"
)

// Adoption is one orphaned request the coordinator asks a member to take
// over (peer.adopt).
type Adoption struct {
	// Request is the request id.
	Request string
	// DeadOwner is the owner the store names, gone from the coordinator's
	// view; the adopter refuses it if that owner is live in its own view.
	DeadOwner string
	// Target is the live decode member that adopts it (Place: least
	// loaded, ties by id).
	Target string
	// DepartedAt is when the coordinator saw DeadOwner leave; zero if it
	// did not see it leave (absent for longer than the grace). The adopter
	// measures failover time from it.
	DepartedAt time.Time
}

// Adoptions is what a coordinator asks, given the owner of every request
// the cluster resumes (Store.Owners), the live decode members, its view
// and when it saw each member leave (departedAt; zero: not seen): every
// request whose owner v says is orphaned, placed by load, in request id
// order. It does not check that the caller coordinates (CoordinatorIn).
func Adoptions(owners map[string]string, live []Candidate, v View, departedAt func(owner string) time.Time) []Adoption {
	placed := Place(OrphansIn(owners, v), live)
	out := make([]Adoption, 0, len(placed))
	for req, target := range placed {
		a := Adoption{Request: req, DeadOwner: owners[req], Target: target}
		if departedAt != nil {
			a.DepartedAt = departedAt(a.DeadOwner)
		}
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Request < out[j].Request })
	return out
}

// Leftovers is, sorted, the requests a previous run of member self (the
// same member id) owned and no actor here runs (running says which do):
// at start no request actor runs, so each is an orphan of that run, which
// self adopts itself.
func Leftovers(owners map[string]string, self string, running func(req string) bool) []string {
	var out []string
	for req, owner := range owners {
		if owner == self && (running == nil || !running(req)) {
			out = append(out, req)
		}
	}
	sort.Strings(out)
	return out
}
