package transport

import "testing"

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
