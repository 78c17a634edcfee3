package kvmem

import (
	"errors"
	"testing"
)

// fakeGuard is a Guard whose brokenness the test sets.
type fakeGuard struct {
	broken, released bool
}

func (g *fakeGuard) Broken() bool { return g.broken }
func (g *fakeGuard) Release()     { g.released = true }

// TestBrokenRegionIsReplaced: a region whose guard reports it broken says
// so (ErrRegionBroken), registering it again maps it afresh instead of
// answering the broken one, and its guard is released once unmapped.
func TestBrokenRegionIsReplaced(t *testing.T) {
	path := "/dev/shm/r"
	l := testLayout()
	var guards []*fakeGuard
	rt := NewRegionTable(&heapOpener{})
	rt.SetGuard(func(mem []byte) (Guard, error) {
		if len(mem) != int(l.Size()) {
			t.Errorf("guarding %d bytes, want the region's %d", len(mem), l.Size())
		}
		g := &fakeGuard{}
		guards = append(guards, g)
		return g, nil
	})
	m, err := rt.Register("e", "r0", path, l)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.CheckBroken(); err != nil || len(guards) != 1 {
		t.Fatalf("fresh region: %v, %d guards", err, len(guards))
	}
	_, release, err := rt.Acquire("e", "r0")
	if err != nil {
		t.Fatal(err)
	}
	guards[0].broken = true
	if err := m.CheckBroken(); !errors.Is(err, ErrRegionBroken) {
		t.Fatalf("broken region: %v, want ErrRegionBroken", err)
	}
	again, err := rt.Register("e", "r0", path, l)
	if err != nil {
		t.Fatalf("register the broken region again: %v", err)
	}
	if again == m || again.Broken() || len(guards) != 2 {
		t.Fatalf("registering again answered the broken region (same=%v broken=%v, %d guards)", again == m, again.Broken(), len(guards))
	}
	if guards[0].released || m.Region.Bytes() == nil {
		t.Fatal("the broken region was unmapped while a reference was held")
	}
	release()
	if !guards[0].released || m.Region.Bytes() != nil {
		t.Fatal("the broken region stayed mapped (or guarded) after its last reference")
	}
	rt.Close()
	if !guards[1].released {
		t.Fatal("Close left a guard")
	}
}
