package kvmem

import (
	"errors"
	"fmt"
	"sort"
	"sync"
)

// ErrUnknownRegion is returned for an engine/region pair that is not registered.
var ErrUnknownRegion = errors.New("kvmem: unknown region")

// ErrRegionExists is returned when registering a region id twice with a
// different file or layout.
var ErrRegionExists = errors.New("kvmem: region already registered differently")

// Mapped is a registered region with its accounting. Users Acquire it and
// call the returned release func when they stop touching its memory, so the
// mapping outlives every reader and writer even after its engine went away.
type Mapped struct {
	Engine string
	ID     string
	Region *Region
	Blocks *BlockTable

	refs int  // guarded by RegionTable.mu
	gone bool // engine went away: unmap at refs == 0
}

// RegionTable is the set of regions mapped by this connexd, keyed by engine
// and region id. It is safe for concurrent use.
type RegionTable struct {
	mu      sync.Mutex
	regions map[[2]string]*Mapped
	open    func(path string, l Layout) (*Region, error)
	dir     *RegionDir // closed by Close; nil if unconfined
	quota   Quota
}

// NewRegionTable returns an empty table that maps region files with OpenRegion.
func NewRegionTable() *RegionTable {
	return &RegionTable{regions: map[[2]string]*Mapped{}, open: OpenRegion}
}

// NewConfinedRegionTable returns an empty table that maps only region
// files dir allows (region_dir).
func NewConfinedRegionTable(dir *RegionDir) *RegionTable {
	return &RegionTable{regions: map[[2]string]*Mapped{}, open: dir.Open, dir: dir}
}

// Register maps the region file. Registering the same engine, id, path and
// layout again is a no-op returning the existing region.
func (t *RegionTable) Register(engine, id, path string, l Layout) (*Mapped, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	key := [2]string{engine, id}
	if m, ok := t.regions[key]; ok {
		if m.Region.Path == path && m.Region.Layout == l {
			return m, nil
		}
		return nil, fmt.Errorf("%w: %s/%s is %s", ErrRegionExists, engine, id, m.Region.Path)
	}
	if err := t.check(engine, l.Size()); err != nil {
		return nil, err
	}
	r, err := t.open(path, l)
	if err != nil {
		return nil, err
	}
	m := &Mapped{Engine: engine, ID: id, Region: r, Blocks: NewBlockTable(l.Blocks)}
	t.regions[key] = m
	return m, nil
}

// Add enters a region connexd created (region.create) under engine and id.
// It fails with ErrRegionExists if the id is taken; the caller then still
// owns r.
func (t *RegionTable) Add(engine, id string, r *Region) (*Mapped, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	key := [2]string{engine, id}
	if m, ok := t.regions[key]; ok {
		return nil, fmt.Errorf("%w: %s/%s is %s", ErrRegionExists, engine, id, m.Region.Path)
	}
	if err := t.check(engine, r.Layout.Size()); err != nil {
		return nil, err
	}
	m := &Mapped{Engine: engine, ID: id, Region: r, Blocks: NewBlockTable(r.Layout.Blocks)}
	t.regions[key] = m
	return m, nil
}

// Acquire returns the region and a release func that must be called exactly
// once when the caller stops using its memory.
func (t *RegionTable) Acquire(engine, id string) (*Mapped, func(), error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, ok := t.regions[[2]string{engine, id}]
	if !ok {
		return nil, nil, fmt.Errorf("%w: engine %q region %q", ErrUnknownRegion, engine, id)
	}
	m.refs++
	var once sync.Once
	return m, func() { once.Do(func() { t.release(m) }) }, nil
}

// Lookup returns the region without taking a reference (for inspection).
func (t *RegionTable) Lookup(engine, id string) (*Mapped, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m, ok := t.regions[[2]string{engine, id}]
	if !ok {
		return nil, fmt.Errorf("%w: engine %q region %q", ErrUnknownRegion, engine, id)
	}
	return m, nil
}

func (t *RegionTable) release(m *Mapped) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m.refs--
	if m.refs == 0 && m.gone {
		_ = m.Region.Close()
	}
}

// DropEngine forgets every region of engine. Each is unmapped as soon as no
// one holds a reference. It returns how many regions were dropped.
func (t *RegionTable) DropEngine(engine string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for key, m := range t.regions {
		if key[0] != engine {
			continue
		}
		delete(t.regions, key)
		m.gone = true
		if m.refs == 0 {
			_ = m.Region.Close()
		}
		n++
	}
	return n
}

// Close drops every region (for shutdown, after all users stopped).
func (t *RegionTable) Close() {
	t.mu.Lock()
	engines := map[string]bool{}
	for key := range t.regions {
		engines[key[0]] = true
	}
	t.mu.Unlock()
	for e := range engines {
		t.DropEngine(e)
	}
	if t.dir != nil {
		_ = t.dir.Close()
	}
}

// Engines lists the engines with registered regions, sorted.
func (t *RegionTable) Engines() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	seen := map[string]bool{}
	var out []string
	for key := range t.regions {
		if !seen[key[0]] {
			seen[key[0]] = true
			out = append(out, key[0])
		}
	}
	sort.Strings(out)
	return out
}
