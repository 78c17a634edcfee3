package requests

import "time"

// PassReport is what one pass of the orphan coordinator found, for
// ScanPace to decide when the next one runs.
type PassReport struct {
	// Kicked: the pass ran for a membership change.
	Kicked bool
	// Failed: reading the store, an adoption, or this member's leftovers
	// failed (they are retried).
	Failed bool
	// Asked is how many adoptions the pass asked for (the next pass
	// confirms they took).
	Asked int
	// Unsettled: no member could coordinate yet, or this one has watched
	// the cluster for less than the grace — who coordinates may then change,
	// and an owner never heard of become an orphan, with no membership
	// change to say so.
	Unsettled bool
}

// ScanPace decides how long the coordinator waits for its next pass when
// no membership change comes first. Orphans appear when an owner leaves,
// which the coordinator hears of at once (a kick), so the periodic rescan
// is a backstop: it runs every Busy while something may be pending — a
// membership change (one more pass one Busy after the kicked one, for
// records that landed as the owner left), a failed pass, adoptions asked,
// a cluster still settling — and every Idle once a pass found nothing to
// do. Each pass the coordinator makes reads the whole request store (a
// JetStream consumer created and deleted), so an idle cluster scanning
// every second cost the NATS server about a quarter of the router's idle
// CPU (`lan` preset, BENCHMARKS.md). The zero Idle keeps every wait at
// Busy.
type ScanPace struct {
	// Busy is orphan_scan_ms.
	Busy time.Duration
	// Idle is orphan_idle_scan_ms.
	Idle time.Duration
}

// Next is the wait before the pass after one that found r.
func (p ScanPace) Next(r PassReport) time.Duration {
	if r.Kicked || r.Failed || r.Asked > 0 || r.Unsettled || p.Idle <= p.Busy {
		return p.Busy
	}
	return p.Idle
}
