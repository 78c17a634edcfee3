package kvmem

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"
)

// ErrUnknownRegion is returned for an engine/region pair that is not registered.
var ErrUnknownRegion = errors.New("kvmem: unknown region")

// ErrRegionExists is returned when registering a region id twice with a
// different file or layout.
var ErrRegionExists = errors.New("kvmem: region already registered differently")

// ErrRegionBroken means a copy from or into the region faulted: the file
// behind its memory shrank (its engine truncated it). The region reads as
// zeros from then on; connexd refuses it until it is created or registered
// again.
var ErrRegionBroken = errors.New("kvmem: region broken: its memory faulted (the file behind it shrank)")

// Guard watches a region's mapping for faults: the data plane's
// transport.Guarded, where the data plane copies outside Go.
type Guard interface {
	// Broken reports whether a copy faulted inside the mapping.
	Broken() bool
	// Release stops watching; called before the mapping goes.
	Release()
}

// Mapped is a registered region with its accounting. Users Acquire it and
// call the returned release func when they stop touching its memory, so the
// mapping outlives every reader and writer even after its engine went away.
type Mapped struct {
	Engine string
	ID     string
	Region *Region
	Blocks *BlockTable

	guard Guard       // nil: unwatched
	refs  int         // guarded by RegionTable.mu
	gone  atomic.Bool // dropped (its engine went away, or broken): unmap at refs == 0; set under RegionTable.mu
}

// Gone reports whether the region was dropped from its table (engine.gone,
// or broken): a user that acquired it before may finish, none may start.
func (m *Mapped) Gone() bool { return m.gone.Load() }

// Broken reports whether a copy from or into the region faulted (see
// ErrRegionBroken).
func (m *Mapped) Broken() bool { return m.guard != nil && m.guard.Broken() }

// CheckBroken returns an error wrapping ErrRegionBroken when the region is
// broken, else nil.
func (m *Mapped) CheckBroken() error {
	if m.Broken() {
		return fmt.Errorf("%w: engine %s region %s", ErrRegionBroken, m.Engine, m.ID)
	}
	return nil
}

// close stops watching and unmaps (or frees) the region.
func (m *Mapped) close() {
	if m.guard != nil {
		m.guard.Release()
	}
	_ = m.Region.Close()
}

// RegionOpener maps the region file an engine registers (region.register)
// for a RegionTable. regionfile.Dir is connexd's: it confines the files to
// region_dir; tests may map heap bytes with NewRegion.
type RegionOpener interface {
	// Open maps the file at path as a region of layout l; the caller owns
	// the region (Close). Errors wrap ErrRegion, ErrBadLayout or
	// ErrOutsideRegionDir.
	Open(path string, l Layout) (*Region, error)
}

// RegionOpenerFunc adapts a function (regionfile.Open) to a RegionOpener.
type RegionOpenerFunc func(path string, l Layout) (*Region, error)

// Open calls f.
func (f RegionOpenerFunc) Open(path string, l Layout) (*Region, error) { return f(path, l) }

// RegionTable is the set of regions mapped by this connexd, keyed by engine
// and region id. It is safe for concurrent use.
type RegionTable struct {
	mu      sync.Mutex
	regions map[[2]string]*Mapped
	open    RegionOpener // closed by Close if it is an io.Closer (regionfile.Dir)
	quota   Quota
	guard   func(mem []byte) (Guard, error) // nil: regions unwatched
}

// SetGuard makes the table watch every region it maps or adds from now on
// with guard (the data plane's transport.FaultGuard). Call it before the
// first region.
func (t *RegionTable) SetGuard(guard func(mem []byte) (Guard, error)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.guard = guard
}

// enter wraps r as the region id of engine, watched by the table's guard,
// and enters it. Call with t.mu held; on error the caller still owns r.
func (t *RegionTable) enter(key [2]string, r *Region) (*Mapped, error) {
	m := &Mapped{Engine: key[0], ID: key[1], Region: r, Blocks: NewBlockTable(r.Layout.Blocks)}
	if t.guard != nil && len(r.Bytes()) > 0 {
		g, err := t.guard(r.Bytes())
		if err != nil {
			return nil, fmt.Errorf("%w: watch region %s/%s for faults: %w", ErrRegion, key[0], key[1], err)
		}
		m.guard = g
	}
	t.regions[key] = m
	return m, nil
}

// dropBroken forgets the region under key if it is broken, so that the
// engine can create or register it again; it reports whether there is
// still a region under key. Call with t.mu held.
func (t *RegionTable) dropBroken(key [2]string) bool {
	m, ok := t.regions[key]
	if !ok {
		return false
	}
	if !m.Broken() {
		return true
	}
	delete(t.regions, key)
	m.gone.Store(true)
	if m.refs == 0 {
		m.close()
	}
	return false
}

// NewRegionTable returns an empty table that maps the region files
// engines register with open: connexd passes a regionfile.Dir, so only
// files beneath region_dir are mapped. The table owns open: if it has a
// Close() error method, the table's Close calls it.
func NewRegionTable(open RegionOpener) *RegionTable {
	return &RegionTable{regions: map[[2]string]*Mapped{}, open: open}
}

// Register maps the region file. Registering the same engine, id, path and
// layout again is a no-op returning the existing region.
func (t *RegionTable) Register(engine, id, path string, l Layout) (*Mapped, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	key := [2]string{engine, id}
	if t.dropBroken(key) {
		m := t.regions[key]
		if m.Region.Path == path && m.Region.Layout == l {
			return m, nil
		}
		return nil, fmt.Errorf("%w: %s/%s is %s", ErrRegionExists, engine, id, m.Region.Path)
	}
	if err := t.check(engine, l.Size()); err != nil {
		return nil, err
	}
	r, err := t.open.Open(path, l)
	if err != nil {
		return nil, err
	}
	m, err := t.enter(key, r)
	if err != nil {
		_ = r.Close()
		return nil, err
	}
	return m, nil
}

// Add enters a region connexd created (region.create) under engine and id.
// It fails with ErrRegionExists if the id is taken; the caller then still
// owns r.
func (t *RegionTable) Add(engine, id string, r *Region) (*Mapped, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	key := [2]string{engine, id}
	if t.dropBroken(key) {
		m := t.regions[key]
		return nil, fmt.Errorf("%w: %s/%s is %s", ErrRegionExists, engine, id, m.Region.Path)
	}
	if err := t.check(engine, r.Layout.Size()); err != nil {
		return nil, err
	}
	return t.enter(key, r)
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

// EngineLayout is the layout of engine's region when it has exactly one
// (ok false: none, or several).
func (t *RegionTable) EngineLayout(engine string) (l Layout, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for key, m := range t.regions {
		if key[0] == engine {
			l, n = m.Region.Layout, n+1
		}
	}
	if n != 1 {
		return Layout{}, false
	}
	return l, true
}

func (t *RegionTable) release(m *Mapped) {
	t.mu.Lock()
	defer t.mu.Unlock()
	m.refs--
	if m.refs == 0 && m.gone.Load() {
		m.close()
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
		m.gone.Store(true)
		if m.refs == 0 {
			m.close()
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
	if c, ok := t.open.(io.Closer); ok {
		_ = c.Close()
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

// EngineBlocks is the number of blocks in engine's regions (what it may
// advertise at most; see advertise.ClampBlocks).
func (t *RegionTable) EngineBlocks(engine string) uint32 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n uint64
	for key, m := range t.regions {
		if key[0] == engine {
			n += uint64(m.Region.Layout.Blocks)
		}
	}
	return uint32(min(n, uint64(^uint32(0))))
}
