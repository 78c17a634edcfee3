package cluster

import "time"

// Sightings remembers, by member name (the connexd member_id, which a
// member keeps across restarts and rejoins, unlike its cluster id), when
// this member saw each other member enter its view and when it saw one
// leave. A caller deciding whether an absent member's work must move asks
// it for a Roster: absence proves departure only after the grace, since a
// member that just (re)joined has not heard of everyone yet.
//
// It reads no clock and starts nothing: every call takes now, and the
// membership events come from the caller (Provider.Subscribe). It is not
// safe for concurrent use; the caller locks.
type Sightings struct {
	self      string               // this member's name: settled once it has watched for grace
	grace     time.Duration        // how long before "absent" means "gone" (Config.SettleAfter)
	joinedAt  time.Time            // when this member started watching
	departed  map[string]time.Time // names seen leaving, not back since, and when
	firstSeen map[string]time.Time // when each present name entered the view
}

// NewSightings starts watching at now as member self, with grace
// (Config.SettleAfter) before an absent member counts as gone and before
// a present one counts as settled.
func NewSightings(self string, grace time.Duration, now time.Time) *Sightings {
	s := &Sightings{self: self, grace: grace}
	s.Rejoin(now)
	return s
}

// Rejoin forgets every sighting and starts watching afresh at now. Call
// it whenever this member (re)joins the cluster: what a paused and evicted
// member believed about departures and ages is stale.
func (s *Sightings) Rejoin(now time.Time) {
	s.joinedAt = now
	s.departed = map[string]time.Time{}
	s.firstSeen = map[string]time.Time{}
}

// Observe records a membership event seen at now: EventJoined starts a
// name's tenure (the first sighting counts) and forgets its departure;
// EventLeft records the departure (the first one counts, until the name
// joins again) and ends its tenure. Other events and unnamed members
// change nothing.
func (s *Sightings) Observe(e Event, now time.Time) {
	name := e.Member.Name
	if name == "" {
		return
	}
	switch e.Type {
	case EventLeft:
		if _, ok := s.departed[name]; !ok {
			s.departed[name] = now
		}
		delete(s.firstSeen, name)
	case EventJoined:
		delete(s.departed, name)
		if _, ok := s.firstSeen[name]; !ok {
			s.firstSeen[name] = now
		}
	}
}

// DepartedAt is when this member saw name leave: zero if it has not, or
// name came back since.
func (s *Sightings) DepartedAt(name string) time.Time { return s.departed[name] }

// Roster is what this member can say about other members at one instant,
// for deciding orphans conservatively (requests.View is built from it).
type Roster struct {
	// Present is every name in the current view, suspects included.
	Present map[string]bool
	// Departed is every name seen leaving and not present since.
	Departed map[string]bool
	// Settled is every present name that has been in the view for at
	// least Grace (this member itself once Watched ≥ Grace): only these
	// have a full view, so only they may coordinate.
	Settled map[string]bool
	// Watched is how long this member has been watching.
	Watched time.Duration
	// Grace is how long an absent member must go unheard of before it
	// counts as gone.
	Grace time.Duration
}

// Roster is the roster at now, given the names present in the view now
// (the caller reads them from its Provider; suspects included).
func (s *Sightings) Roster(present []string, now time.Time) Roster {
	r := Roster{Present: map[string]bool{}, Departed: map[string]bool{}, Settled: map[string]bool{}, Watched: now.Sub(s.joinedAt), Grace: s.grace}
	for _, n := range present {
		r.Present[n] = true
		seen, ok := s.firstSeen[n]
		if n == s.self {
			seen, ok = s.joinedAt, true
		}
		if ok && now.Sub(seen) >= s.grace {
			r.Settled[n] = true
		}
	}
	for n := range s.departed {
		if !r.Present[n] {
			r.Departed[n] = true
		}
	}
	return r
}
