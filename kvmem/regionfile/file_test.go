package regionfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/connex/connex/kvmem"
)

func testLayout() kvmem.Layout {
	return kvmem.Layout{Layers: 3, Planes: 2, Blocks: 8, BlockBytes: 16, BlockSize: 16, TPSize: 1}
}

func TestRegionSharedMapping(t *testing.T) {
	path := filepath.Join(t.TempDir(), "region")
	l := testLayout()
	eng, err := Create(path, l)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	d, err := Open(path, l)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	copy(eng.Block(2, 1, 5), "hello, kv block!")
	if got := string(d.Block(2, 1, 5)); got != "hello, kv block!" {
		t.Fatalf("shared mapping sees %q", got)
	}
	wrong := l
	wrong.Blocks = 9
	if _, err := Open(path, wrong); !errors.Is(err, kvmem.ErrBadLayout) {
		t.Fatalf("size mismatch: want ErrBadLayout, got %v", err)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing"), l); !errors.Is(err, kvmem.ErrRegion) {
		t.Fatalf("missing file: want ErrRegion, got %v", err)
	}
	if _, err := Open(os.TempDir(), l); err == nil {
		t.Fatal("a directory must not open as a region")
	}
	if err := d.Close(); err != nil || d.Close() != nil {
		t.Fatal("close must be idempotent")
	}
}
