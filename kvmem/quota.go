package kvmem

import (
	"errors"
	"fmt"
)

// ErrOverQuota refuses a region that would take an engine or this member
// over its region_* limits.
var ErrOverQuota = errors.New("kvmem: over quota")

// Quota bounds the regions one connexd maps (region_max_bytes,
// region_max_bytes_per_engine, region_max_per_engine). Zero fields are
// unlimited.
type Quota struct {
	MemberBytes      uint64 // all regions of this member
	EngineBytes      uint64 // all regions of one engine
	RegionsPerEngine int    // regions of one engine
}

// check reports whether a new region of n bytes for engine fits next to
// the regions in t (t.mu held).
func (t *RegionTable) check(engine string, n uint64) error {
	q := t.quota
	var member, eng uint64
	regions := 0
	for key, m := range t.regions {
		if m.gone.Load() {
			continue
		}
		member += m.Region.Layout.Size()
		if key[0] == engine {
			eng += m.Region.Layout.Size()
			regions++
		}
	}
	switch {
	case q.RegionsPerEngine > 0 && regions+1 > q.RegionsPerEngine:
		return fmt.Errorf("%w: engine %s has %d regions (region_max_per_engine=%d)", ErrOverQuota, engine, regions, q.RegionsPerEngine)
	case q.EngineBytes > 0 && eng+n > q.EngineBytes:
		return fmt.Errorf("%w: engine %s would map %d bytes of regions (region_max_bytes_per_engine=%d)", ErrOverQuota, engine, eng+n, q.EngineBytes)
	case q.MemberBytes > 0 && member+n > q.MemberBytes:
		return fmt.Errorf("%w: this member would map %d bytes of regions (region_max_bytes=%d)", ErrOverQuota, member+n, q.MemberBytes)
	}
	return nil
}

// SetQuota sets the limits later registrations and creations are checked
// against.
func (t *RegionTable) SetQuota(q Quota) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.quota = q
}

// Admit checks, before anything is allocated, that a region of layout l
// for engine fits its quota (Add checks again).
func (t *RegionTable) Admit(engine string, l Layout) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.check(engine, l.Size())
}
