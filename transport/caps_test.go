package transport

import (
	"errors"
	"testing"
)

// TestOneKeyForExtents: any memory where ExtentKeys holds; memory from the
// backend's Allocate also where only AllocationExtentKeys does.
func TestOneKeyForExtents(t *testing.T) {
	for _, c := range []struct {
		caps                Caps
		plain, onAllocation bool
	}{
		{Caps{}, false, false},
		{Caps{ExtentKeys: true}, true, true},
		{Caps{AllocationExtentKeys: true}, false, true},
		{Caps{ExtentKeys: true, AllocationExtentKeys: true}, true, true},
	} {
		if got := c.caps.OneKeyForExtents(false); got != c.plain {
			t.Errorf("%+v: OneKeyForExtents(false) = %v", c.caps, got)
		}
		if got := c.caps.OneKeyForExtents(true); got != c.onAllocation {
			t.Errorf("%+v: OneKeyForExtents(true) = %v", c.caps, got)
		}
	}
}

// liar is a Backend whose Caps say what the test sets, implementing
// none of the optional interfaces.
type liar struct {
	Backend
	caps Caps
}

func (b *liar) Caps() Caps   { return b.caps }
func (b *liar) Name() string { return "liar" }

// liarEndpoint is an Endpoint of none of the optional interfaces.
type liarEndpoint struct{ Endpoint }

// liarReg counts its Deregister calls.
type liarReg struct {
	Registration
	n *int
}

func (r liarReg) Deregister() error { *r.n++; return nil }

// TestCheckCapsCatchesLies: a flag promising an interface the backend
// lacks is refused at open, and the helpers that choose by Caps say so
// instead of quietly falling back (DeregisterEach still revokes every
// key).
func TestCheckCapsCatchesLies(t *testing.T) {
	if err := CheckCaps(&liar{}); err != nil {
		t.Fatalf("no promise, but %v", err)
	}
	for _, c := range []Caps{
		{ExtentKeys: true}, {AllocationExtentKeys: true}, {Allocate: true}, {ManyRegister: true},
		{ManyDeregister: true}, {GuardFaults: true}, {Counters: true}, {MaxGetBytes: -1},
	} {
		if err := CheckCaps(&liar{caps: c}); !errors.Is(err, ErrCapsLie) {
			t.Errorf("%+v: CheckCaps = %v, want ErrCapsLie", c, err)
		}
	}
	if _, err := ViewerOf(&liar{caps: Caps{Views: true}}, liarEndpoint{}); !errors.Is(err, ErrCapsLie) {
		t.Errorf("ViewerOf an endpoint that is no Viewer: %v", err)
	}
	b := &liar{caps: Caps{ManyRegister: true, ManyDeregister: true}}
	if _, err := RegisterEach(b, [][]byte{{1}, {2}}); !errors.Is(err, ErrCapsLie) {
		t.Errorf("RegisterEach on a ManyRegister liar: %v", err)
	}
	n := 0
	if err := DeregisterEach(b, []Registration{liarReg{n: &n}, liarReg{n: &n}}); !errors.Is(err, ErrCapsLie) || n != 2 {
		t.Errorf("DeregisterEach on a ManyDeregister liar: %v, %d of 2 deregistered", err, n)
	}
}
