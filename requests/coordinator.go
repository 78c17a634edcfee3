package requests

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Membership is what the orphan coordinator needs from cluster
// membership: the live decode members (by API member id, suspects
// excluded) with their load, the view it decides orphans on, when it saw
// a member leave, and change notifications.
type Membership interface {
	// LiveDecode is the live decode members, suspects excluded.
	LiveDecode() []Candidate
	// View says which owners are present, which were seen leaving, and how
	// long this member has watched (see View).
	View() View
	// DepartedAt is when this member saw name leave (zero: it has not).
	DepartedAt(name string) time.Time
	// OnChange calls fn on every membership change until cancel; fn must
	// return quickly.
	OnChange(fn func()) (cancel func())
}

// passTimeout bounds one scan of the store and the adoptions it asks for.
const passTimeout = 5 * time.Second

// Coordinator is the orphan coordinator's loop on one member: at start it
// adopts the requests its previous run left (Leftovers), then, on every
// membership change and every Interval (IdleInterval once nothing is
// pending: ScanPace), if it is the coordinator
// (CoordinatorIn), it asks live members to adopt the requests of departed
// owners (Adoptions). Every member runs one, so the next coordinator
// finishes what a dead one left. Fill every field, then call Run.
type Coordinator struct {
	// Self is this member's id (member_id).
	Self string
	// Members is cluster membership.
	Members Membership
	// Owners reads the owner of every request the cluster resumes
	// (KVStore.Owners).
	Owners func(ctx context.Context) (map[string]string, error)
	// Adopt asks a.Target to adopt a.Request (peer.adopt). An error
	// wrapping ErrFenced means someone adopted it already: not a failure.
	Adopt func(ctx context.Context, a Adoption) error
	// AdoptHere resumes on this member a request its previous run owned.
	// An error wrapping ErrFenced means someone adopted it already.
	AdoptHere func(ctx context.Context, req, owner string) error
	// Running reports whether a request actor for req runs here.
	Running func(req string) bool
	// Interval is how often it rescans without a membership change
	// while something may be pending (orphan_scan_ms; ScanPace.Busy), in
	// case a coordinator died mid-way.
	Interval time.Duration
	// IdleInterval is how often it rescans once a pass found nothing
	// pending (orphan_idle_scan_ms; ScanPace.Idle). Zero: every Interval.
	IdleInterval time.Duration
	// Log gets a warning for each pass that failed (it is retried).
	Log *slog.Logger
}

// Run loops until stop is closed. It returns when stop closes, after the
// pass in progress.
func (c *Coordinator) Run(stop <-chan struct{}) {
	kick := make(chan struct{}, 1)
	cancel := c.Members.OnChange(func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	})
	defer cancel()
	pace := ScanPace{Busy: c.Interval, Idle: c.IdleInterval}
	wait := c.Interval
	leftovers := true
	for {
		leftoversFailed := false
		if leftovers {
			if err := c.adoptLeftovers(); err != nil {
				c.Log.Warn("adopting requests of this member's previous run failed; will retry", "err", err)
				leftoversFailed = true
			} else {
				leftovers = false
			}
		}
		t := time.NewTimer(wait)
		kicked := false
		select {
		case <-stop:
			t.Stop()
			return
		case <-kick:
			kicked = true
		case <-t.C:
		}
		t.Stop()
		r, err := c.placeOrphans()
		if err != nil {
			c.Log.Warn("placing orphaned requests failed; will retry", "err", err)
		}
		r.Kicked, r.Failed = kicked, err != nil || leftoversFailed
		wait = pace.Next(r)
	}
}

// placeOrphans is one pass: if this member coordinates, it asks for every
// adoption its view calls for.
func (c *Coordinator) placeOrphans() (PassReport, error) {
	live := c.Members.LiveDecode()
	view := c.Members.View()
	// Until this member has watched for the grace, who coordinates can
	// change with no membership change to say so (it may settle first).
	r := PassReport{Unsettled: view.Watched < view.Grace}
	switch CoordinatorIn(live, view) {
	case "":
		return PassReport{Unsettled: true}, nil
	case c.Self:
	default:
		return r, nil // another member coordinates: its pass, not ours
	}
	err := c.pass(func(ctx context.Context, owners map[string]string) []error {
		var errs []error
		for _, a := range Adoptions(owners, live, view, c.Members.DepartedAt) {
			r.Asked++
			if err := c.Adopt(ctx, a); err != nil && !errors.Is(err, ErrFenced) {
				errs = append(errs, fmt.Errorf("adopt %s on %s: %w", a.Request, a.Target, err))
			}
		}
		return errs
	})
	return r, err
}

// adoptLeftovers resumes here the requests a previous run of this member
// owned.
func (c *Coordinator) adoptLeftovers() error {
	return c.pass(func(ctx context.Context, owners map[string]string) []error {
		var errs []error
		for _, req := range Leftovers(owners, c.Self, c.Running) {
			if err := c.AdoptHere(ctx, req, c.Self); err != nil && !errors.Is(err, ErrFenced) {
				errs = append(errs, fmt.Errorf("adopt %s: %w", req, err))
			}
		}
		return errs
	})
}

// pass reads the owners of every request and hands them to adopt, all
// within passTimeout, and joins the errors adopt returns.
func (c *Coordinator) pass(adopt func(ctx context.Context, owners map[string]string) []error) error {
	ctx, cancel := context.WithTimeout(context.Background(), passTimeout)
	defer cancel()
	owners, err := c.Owners(ctx)
	if err != nil {
		return err
	}
	return errors.Join(adopt(ctx, owners)...)
}
