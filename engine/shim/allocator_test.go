package shim

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

func TestShimAllocatorHoldComesBackOnlyWithFreed(t *testing.T) {
	a := NewAllocator(8)
	ids, err := a.Alloc(3)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []uint32{0, 1, 2}) {
		t.Fatalf("alloc gave %v, want the lowest ids", ids)
	}
	if freed, err := a.Hold("t1", ids); err != nil || freed {
		t.Fatalf("hold: freed=%v err=%v", freed, err)
	}
	if err := a.Free(ids); err == nil {
		t.Fatal("Free of held blocks succeeded; they must come back only with blocks.freed")
	}
	if a.FreeCount() != 5 {
		t.Fatalf("free=%d after holding 3 of 8", a.FreeCount())
	}
	if n, err := a.Freed("t1", []uint32{2, 1, 0}); n != 3 || err != nil {
		t.Fatalf("Freed = %d, %v", n, err)
	}
	if n, _ := a.Freed("t1", ids); n != 0 {
		t.Fatalf("a second blocks.freed freed %d blocks again", n)
	}
	if a.FreeCount() != 8 || a.Held() != 0 {
		t.Fatalf("free=%d held=%d, want 8 and 0", a.FreeCount(), a.Held())
	}
}

func TestShimAllocatorNoticeBeforeHold(t *testing.T) {
	a := NewAllocator(4)
	ids, _ := a.Alloc(2)
	if n, _ := a.Freed("t9", ids); n != 0 {
		t.Fatalf("early notice freed %d blocks before the hold was recorded", n)
	}
	freed, err := a.Hold("t9", ids)
	if err != nil || !freed {
		t.Fatalf("hold after its notice: freed=%v err=%v, want the blocks back at once", freed, err)
	}
	if a.FreeCount() != 4 {
		t.Fatalf("free=%d, want 4", a.FreeCount())
	}
}

func TestShimAllocatorLimitsAndMisuse(t *testing.T) {
	a := NewAllocator(4)
	if _, err := a.Alloc(5); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("alloc 5 of 4: %v, want ErrTooLarge", err)
	}
	ids, _ := a.Alloc(3)
	if _, err := a.Alloc(2); !errors.Is(err, ErrNoBlocks) {
		t.Fatalf("alloc 2 with 1 free: %v, want ErrNoBlocks", err)
	}
	if err := a.Free([]uint32{3}); err == nil {
		t.Fatal("free of a block never allocated succeeded")
	}
	if err := a.Free(ids); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(ids); err == nil {
		t.Fatal("double free succeeded")
	}
	if a.FreeCount() != 4 {
		t.Fatalf("free=%d, want 4", a.FreeCount())
	}
}

// TestDropHoldsGivesBackEveryHold: holds that died with their connexd give
// their blocks back at once, and a late notice for one frees nothing twice.
func TestDropHoldsGivesBackEveryHold(t *testing.T) {
	a := NewAllocator(8)
	ids, err := a.Alloc(4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Hold("t1", ids[:2]); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Hold("t2", ids[2:]); err != nil {
		t.Fatal(err)
	}
	if n := a.DropHolds(); n != 2 || a.FreeCount() != 8 || a.Held() != 0 {
		t.Fatalf("DropHolds: %d dropped, %d free, %d held", n, a.FreeCount(), a.Held())
	}
	if n, _ := a.Freed("t1", ids[:2]); n != 0 || a.FreeCount() != 8 {
		t.Fatalf("a late blocks.freed after DropHolds gave back %d (free %d)", n, a.FreeCount())
	}
}

// A repeated blocks.freed of a transfer already freed is not kept as an
// early notice (it would free a later hold of that id at once), and early
// notices are bounded by age, the oldest forgotten first, never the newest
// dropped.
func TestShimAllocatorEarlyNoticesStayFresh(t *testing.T) {
	a := NewAllocator(8)
	ids, _ := a.Alloc(2)
	if _, err := a.Hold("t1", ids); err != nil {
		t.Fatal(err)
	}
	if n, _ := a.Freed("t1", ids); n != 2 {
		t.Fatalf("freed %d", n)
	}
	if n, _ := a.Freed("t1", ids); n != 0 || len(a.early) != 0 {
		t.Fatalf("a repeated notice: freed %d, %d early notices; want 0 and 0", n, len(a.early))
	}
	for i := range maxNotices + 10 {
		a.Freed(fmt.Sprintf("stale%d", i), nil)
	}
	if len(a.early) != maxNotices {
		t.Fatalf("%d early notices kept, want %d", len(a.early), maxNotices)
	}
	if _, ok := a.early["stale0"]; ok {
		t.Fatal("the oldest early notice was kept past the bound")
	}
	// A real early notice after the stale ones is kept: its hold comes back
	// at Hold.
	a.Freed("t2", []uint32{3, 4})
	ids2, _ := a.Alloc(2)
	if freed, err := a.Hold("t2", ids2); err != nil || !freed {
		t.Fatalf("hold of a transfer whose notice came first: freed=%v err=%v", freed, err)
	}
}

// Holds whose blocks.freed notices were lost for good come back from
// connexd's state: those held before the state was read and not in it.
func TestShimAllocatorFreedUnless(t *testing.T) {
	a := NewAllocator(8)
	for _, id := range []string{"t1", "t2"} {
		ids, _ := a.Alloc(2)
		if _, err := a.Hold(id, ids); err != nil {
			t.Fatal(err)
		}
	}
	before := a.HeldIDs()
	ids, _ := a.Alloc(2)
	if _, err := a.Hold("t3", ids); err != nil { // made after the state read began
		t.Fatal(err)
	}
	if n := a.FreedUnless(map[string]bool{"t2": true}, before); n != 1 {
		t.Fatalf("FreedUnless gave back %d holds, want 1 (t1)", n)
	}
	if a.Held() != 2 || a.FreeCount() != 4 {
		t.Fatalf("held %d free %d, want t2 and t3 held, 4 free", a.Held(), a.FreeCount())
	}
	if n, _ := a.Freed("t1", nil); n != 0 || len(a.early) != 0 {
		t.Fatalf("t1's late notice: freed %d, early %d; want nothing", n, len(a.early))
	}
}
