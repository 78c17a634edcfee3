package natsbus

import "fmt"

// connTable counts the open connections of each engine identity on one
// NATS server and decides which new ones are over a limit. NATS bounds
// connections per account and per server, not per user, so connexd bounds
// them per engine identity itself (the user JWT's name, "engine:<m>/<e>":
// every credentials file minted for one engine counts against the same
// limit). It is pure: the caller feeds it the server's connect and
// disconnect events and closes what it refuses.
type connTable struct {
	perEngine int // open connections one engine identity may hold
	engines   int // open connections all engine identities together may hold
	open      map[string]map[uint64]struct{}
	total     int
}

func newConnTable(perEngine, engines int) *connTable {
	return &connTable{perEngine: perEngine, engines: engines, open: map[string]map[uint64]struct{}{}}
}

// admit records connection cid of engine identity name, or says why it is
// over a limit (then it is not recorded: the caller closes it). Before
// refusing, it asks stillOpen about the connections it counts against the
// limit and forgets those the server has closed, so a lost disconnect
// event never locks an engine out.
func (t *connTable) admit(name string, cid uint64, stillOpen func(cid uint64) bool) error {
	if _, dup := t.open[name][cid]; dup {
		return nil
	}
	if len(t.open[name]) >= t.perEngine {
		t.prune(name, stillOpen)
	}
	if n := len(t.open[name]); n >= t.perEngine {
		return fmt.Errorf("%s holds %d connections, its limit (nats_engine_connections)", name, n)
	}
	if t.total >= t.engines {
		for n := range t.open {
			t.prune(n, stillOpen)
		}
	}
	if t.total >= t.engines {
		return fmt.Errorf("engines hold %d connections, their limit on this server (three quarters of nats_max_connections)", t.total)
	}
	if t.open[name] == nil {
		t.open[name] = map[uint64]struct{}{}
	}
	t.open[name][cid] = struct{}{}
	t.total++
	return nil
}

// closed forgets connection cid of name (a disconnect event; one of a
// connection admit refused, or never saw, changes nothing).
func (t *connTable) closed(name string, cid uint64) {
	if _, ok := t.open[name][cid]; !ok {
		return
	}
	delete(t.open[name], cid)
	t.total--
	if len(t.open[name]) == 0 {
		delete(t.open, name)
	}
}

// count is how many open connections name holds.
func (t *connTable) count(name string) int { return len(t.open[name]) }

func (t *connTable) prune(name string, stillOpen func(uint64) bool) {
	for cid := range t.open[name] {
		if !stillOpen(cid) {
			t.closed(name, cid)
		}
	}
}
