package daemon

import (
	"sync"
	"time"

	"github.com/connex/connex/cluster"
	"github.com/connex/connex/requests"
)

// memberRoster is membership's decisions, apart from the protoactor
// cluster that feeds it: the sightings of members joining and leaving
// (cluster.Sightings), and from them and the members in the view now, the
// requests.View the orphan coordinator and request.adopt read. It reads
// time from now only; clusterMembers passes time.Now (monotonic, never
// skewed).
type memberRoster struct {
	now  func() time.Time
	mu   sync.Mutex
	seen *cluster.Sightings
}

func newMemberRoster(self string, grace time.Duration, now func() time.Time) *memberRoster {
	return &memberRoster{now: now, seen: cluster.NewSightings(self, grace, now())}
}

// rejoin starts from a clean slate: what a paused member believed about
// departures and ages is stale.
func (r *memberRoster) rejoin() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen.Rejoin(r.now())
}

// observe feeds one membership event to the sightings.
func (r *memberRoster) observe(e cluster.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen.Observe(e, r.now())
}

// view is the roster of the named members in view (suspects included:
// they have not left).
func (r *memberRoster) view(members []cluster.Member) requests.View {
	var names []string
	for _, m := range members {
		if m.Name != "" {
			names = append(names, m.Name)
		}
	}
	r.mu.Lock()
	ro := r.seen.Roster(names, r.now())
	r.mu.Unlock()
	return requests.View{Present: ro.Present, Departed: ro.Departed, Settled: ro.Settled, Watched: ro.Watched, Grace: ro.Grace}
}

// departedAt is when this member saw name leave (zero if it has not, or it
// came back since).
func (r *memberRoster) departedAt(name string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen.DepartedAt(name)
}

// decodeCandidates are the placement candidates among members: named
// decode members that are not suspect.
func decodeCandidates(members []cluster.Member) []requests.Candidate {
	var out []requests.Candidate
	for _, m := range members {
		if m.Name != "" && m.Role == cluster.RoleDecode && !m.Suspect {
			out = append(out, requests.Candidate{ID: m.Name, Load: m.Load})
		}
	}
	return out
}

// leftForGood reports whether e is another member's departure that no
// live member contradicts: a departure reported late (a dead notice or
// protoactor's block arriving after the member restarted, or rejoined with
// a new id after an eviction) is not the live incarnation's.
func leftForGood(e cluster.Event, self string, live []cluster.Member) bool {
	if e.Type != cluster.EventLeft || e.Member.Name == "" || e.Member.Name == self {
		return false
	}
	for _, m := range live {
		if m.Name == e.Member.Name {
			return false
		}
	}
	return true
}
