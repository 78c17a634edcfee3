package actors

import "sync/atomic"

// Metrics are connexd's counters. They are exported in the micro service's
// $SRV.STATS reply and logged at shutdown.
type Metrics struct {
	HoldsCreated atomic.Int64 // holds created
	HoldsFreed   atomic.Int64 // holds ended (blocks back to the engine, or quarantined)
	DoubleFrees  atomic.Int64 // frees refused by block accounting (must stay 0)
	// HoldsQuarantined counts ended holds whose registrations the data
	// plane could not revoke: their blocks stay held for good (must stay 0).
	HoldsQuarantined atomic.Int64
	PullsStarted     atomic.Int64 // pulls started on this member (decode side)
	PullsOK          atomic.Int64 // pulls that completed
	PullsFailed      atomic.Int64 // pulls that failed
	PullsAbandoned   atomic.Int64 // pulls of our holds whose reader never reported back
	BytesPulled      atomic.Int64 // bytes read by completed pulls
	// ReservationsTaken counts reads reserved at request.start that a
	// pull took (pull/reserve.go): pulls that did not wait for the holder.
	ReservationsTaken atomic.Int64
	// ReservationsDropped counts reserved reads no pull took (their
	// time passed, their request finished, the pull did not fit them,
	// connexd stopped): each cost the holder a read registered and ended.
	ReservationsDropped atomic.Int64
	LeaseRenewals       atomic.Int64 // hold.renew calls that extended a lease
	TakenOver           atomic.Int64 // requests moved to an engine here by a router's resume (request.start takeover)
	Adopted             atomic.Int64 // requests of departed members adopted here
	Fenced              atomic.Int64 // activations here told that their request moved elsewhere
	HoldsLost           atomic.Int64 // running requests here whose hold was gone (hold.lost notices)
	// GrantsMoved counts requests moved here when the router's grant
	// arrived, ahead of the engine's takeover (peer.grant).
	GrantsMoved atomic.Int64
	// GrantsLapsed counts grants whose engine never sent its takeover: a
	// request moved ahead is then deleted and its hold released.
	GrantsLapsed atomic.Int64
}

// Snapshot returns the counters by name.
func (m *Metrics) Snapshot() map[string]int64 {
	return map[string]int64{
		"holds_created": m.HoldsCreated.Load(), "holds_freed": m.HoldsFreed.Load(),
		"double_frees": m.DoubleFrees.Load(), "holds_quarantined": m.HoldsQuarantined.Load(), "pulls_started": m.PullsStarted.Load(),
		"pulls_ok": m.PullsOK.Load(), "pulls_failed": m.PullsFailed.Load(),
		"pulls_abandoned": m.PullsAbandoned.Load(), "bytes_pulled": m.BytesPulled.Load(),
		"reservations_taken": m.ReservationsTaken.Load(), "reservations_dropped": m.ReservationsDropped.Load(),
	}
}
