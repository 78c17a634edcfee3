package natsbus

import "testing"

// TestConnTableBoundsEachEngine: an engine past its limit is refused while
// another engine is admitted; a refused or closed connection frees nothing
// it did not hold; and a connection the server closed without an event is
// pruned before anyone is refused for it.
func TestConnTableBoundsEachEngine(t *testing.T) {
	open := map[uint64]bool{}
	stillOpen := func(cid uint64) bool { return open[cid] }
	tb := newConnTable(2, 5)
	admit := func(name string, cid uint64) error {
		err := tb.admit(name, cid, stillOpen)
		if err == nil {
			open[cid] = true
		}
		return err
	}
	for cid := uint64(1); cid <= 2; cid++ {
		if err := admit("engine:m/a", cid); err != nil {
			t.Fatalf("a's connection %d: %v", cid, err)
		}
	}
	if err := admit("engine:m/a", 3); err == nil {
		t.Fatal("a's third connection was admitted past its limit of 2")
	}
	if err := admit("engine:m/b", 4); err != nil {
		t.Fatalf("b's first connection while a is at its limit: %v", err)
	}
	tb.closed("engine:m/a", 3) // the refused one's disconnect event
	if got := tb.count("engine:m/a"); got != 2 {
		t.Fatalf("a holds %d after its refused connection closed, want 2", got)
	}
	delete(open, 1) // closed, its disconnect event lost
	if err := admit("engine:m/a", 5); err != nil {
		t.Fatalf("a's connection after one closed without an event: %v", err)
	}
	if err := admit("engine:m/c", 6); err != nil {
		t.Fatal(err)
	}
	if err := admit("engine:m/d", 7); err != nil {
		t.Fatal(err)
	}
	if err := admit("engine:m/e", 8); err == nil {
		t.Fatal("engines together were admitted past their share of 5")
	}
	tb.closed("engine:m/d", 7)
	delete(open, 7)
	if err := admit("engine:m/e", 8); err != nil {
		t.Fatalf("e after d left: %v", err)
	}
	if err := admit("engine:m/e", 8); err != nil {
		t.Fatalf("a repeated connect event: %v", err)
	}
	if tb.total != 5 {
		t.Fatalf("total %d, want 5", tb.total)
	}
}

func TestEngineShareLeavesRoomForMembers(t *testing.T) {
	for _, max := range []int{64, 4096, 100000} {
		if s := engineShare(max); s <= 0 || max-s < max/4 {
			t.Errorf("engineShare(%d) = %d", max, s)
		}
	}
}
