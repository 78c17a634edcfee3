package kvmem

import (
	"errors"
	"testing"
)

// TestRegionQuota: regions beyond an engine's count or bytes, or beyond
// the member's bytes, are refused before anything is mapped; dropping an
// engine frees its share.
func TestRegionQuota(t *testing.T) {
	tab := NewRegionTable(&heapOpener{})
	defer tab.Close()
	l := Layout{Layers: 1, Planes: 2, Blocks: 4, BlockBytes: 4096, BlockSize: 16, TPSize: 1} // 32 KiB
	tab.SetQuota(Quota{MemberBytes: 3 * l.Size(), EngineBytes: 2 * l.Size(), RegionsPerEngine: 2})
	file := func(name string) string { return "/dev/shm/" + name }
	for _, c := range []struct {
		engine, id string
		ok         bool
	}{
		{"a", "r0", true},
		{"a", "r1", true},
		{"a", "r2", false}, // a's third region (count and bytes)
		{"b", "r0", true},
		{"c", "r0", false}, // the member's fourth region's worth of bytes
	} {
		if err := tab.Admit(c.engine, l); (err == nil) != c.ok {
			t.Fatalf("Admit %s/%s: %v, want ok=%v", c.engine, c.id, err, c.ok)
		}
		_, err := tab.Register(c.engine, c.id, file(c.engine+c.id+".kv"), l)
		if c.ok && err != nil {
			t.Fatalf("register %s/%s: %v", c.engine, c.id, err)
		}
		if !c.ok && !errors.Is(err, ErrOverQuota) {
			t.Fatalf("register %s/%s: %v, want ErrOverQuota", c.engine, c.id, err)
		}
	}
	tab.DropEngine("a")
	if _, err := tab.Register("c", "r0", file("c-again.kv"), l); err != nil {
		t.Fatalf("after engine a left, c's region: %v", err)
	}
	if err := (Layout{Layers: 1, Planes: 2, Blocks: MaxBlocks + 1, BlockBytes: 1, BlockSize: 16, TPSize: 1}).Validate(); !errors.Is(err, ErrBadLayout) {
		t.Fatalf("a layout of %d blocks: %v, want ErrBadLayout", MaxBlocks+1, err)
	}
}
