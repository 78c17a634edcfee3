package kvmem

import "testing"

// TestEngineLayout: an engine's layout is known only while it has exactly
// one region (a pull reservation needs the one layout its pull will have).
func TestEngineLayout(t *testing.T) {
	l := testLayout()
	rt := NewRegionTable(&heapOpener{})
	if _, ok := rt.EngineLayout("e"); ok {
		t.Fatal("a layout for an engine of no region")
	}
	if _, err := rt.Register("e", "r0", "/dev/shm/r0", l); err != nil {
		t.Fatal(err)
	}
	if got, ok := rt.EngineLayout("e"); !ok || got != l {
		t.Fatalf("EngineLayout = %+v %v, want %+v", got, ok, l)
	}
	if _, err := rt.Register("e", "r1", "/dev/shm/r1", l); err != nil {
		t.Fatal(err)
	}
	if _, ok := rt.EngineLayout("e"); ok {
		t.Fatal("a layout for an engine of two regions")
	}
	if _, ok := rt.EngineLayout("other"); ok {
		t.Fatal("a layout for another engine")
	}
}
