package regionfile

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/connex/connex/kvmem"
)

// TestRegionDirConfines: region.register opens only regular files beneath
// region_dir, reached without links, owned by an allowed user; refusals
// say nothing about what is outside.
func TestRegionDirConfines(t *testing.T) {
	l := kvmem.Layout{Layers: 1, Planes: 2, Blocks: 4, BlockBytes: 4096, BlockSize: 16, TPSize: 1}
	root := t.TempDir()
	outside := t.TempDir()
	d, err := OpenDir(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	mk := func(dir, name string, size uint64) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, make([]byte, size), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := mk(root, "engine.kv", l.Size())
	if err := os.Mkdir(filepath.Join(root, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	nested := mk(filepath.Join(root, "sub"), "e.kv", l.Size())
	secret := mk(outside, "secret", l.Size())
	if err := os.Symlink(secret, filepath.Join(root, "link.kv")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, "dirlink")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{good, nested} {
		r, err := d.Open(p, l)
		if err != nil {
			t.Fatalf("open %s: %v", p, err)
		}
		r.Close()
	}
	for _, c := range []struct{ path, why string }{
		{secret, "not beneath region_dir"},
		{filepath.Join(root, "..", filepath.Base(outside), "secret"), "not beneath region_dir"},
		{filepath.Join(root, "link.kv"), "symbolic link"},
		{filepath.Join(root, "dirlink", "secret"), "symbolic link"},
		{filepath.Join(root, "fifo"), "not a regular file"},
		{filepath.Join(root, "sub"), "not a regular file"},
		{filepath.Join(root, "missing.kv"), "no such file"},
		{"engine.kv", "not an absolute path"},
		{root, "not beneath region_dir"},
	} {
		_, err := d.Open(c.path, l)
		if !errors.Is(err, kvmem.ErrOutsideRegionDir) || !strings.Contains(err.Error(), c.why) {
			t.Errorf("open %s: %v, want ErrOutsideRegionDir (%s)", c.path, err, c.why)
		}
		if err != nil && strings.Contains(err.Error(), strconv.FormatUint(l.Size(), 10)) {
			t.Errorf("open %s: the refusal tells the file's size: %v", c.path, err)
		}
	}
	// A file of the wrong size inside is a layout error (the engine's own file).
	if _, err := d.Open(mk(root, "small.kv", 4096), l); !errors.Is(err, kvmem.ErrBadLayout) {
		t.Fatalf("wrong size inside region_dir: %v, want ErrBadLayout", err)
	}
	// Another user's file, even inside, is refused.
	if os.Geteuid() != 0 {
		t.Skip("chown needs root: the owner check is not exercised")
	}
	other := mk(root, "other.kv", l.Size())
	if err := os.Chown(other, 12345, 12345); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Open(other, l); !errors.Is(err, kvmem.ErrOutsideRegionDir) || !strings.Contains(err.Error(), "uid 12345") {
		t.Fatalf("another user's file: %v, want refused naming its owner", err)
	}
	allow, err := OpenDir(root, []int{12345})
	if err != nil {
		t.Fatal(err)
	}
	defer allow.Close()
	r, err := allow.Open(other, l)
	if err != nil {
		t.Fatalf("a file of an allowed owner: %v", err)
	}
	r.Close()
}

// TestConfinedRegionTable: a RegionTable over a Dir maps engines' files
// beneath region_dir, refuses the others, and closes the Dir with itself.
func TestConfinedRegionTable(t *testing.T) {
	l := kvmem.Layout{Layers: 1, Planes: 2, Blocks: 4, BlockBytes: 4096, BlockSize: 16, TPSize: 1}
	root := t.TempDir()
	d, err := OpenDir(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	tab := kvmem.NewRegionTable(d)
	inside := filepath.Join(root, "e.kv")
	eng, err := Create(inside, l)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	outside := filepath.Join(t.TempDir(), "e.kv")
	out, err := Create(outside, l)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	m, err := tab.Register("e", "r0", inside, l)
	if err != nil {
		t.Fatal(err)
	}
	copy(eng.Block(0, 1, 3), "kv")
	if string(m.Region.Block(0, 1, 3)[:2]) != "kv" {
		t.Fatal("the table's mapping does not see the engine's write")
	}
	if _, err := tab.Register("e", "r1", outside, l); !errors.Is(err, kvmem.ErrOutsideRegionDir) {
		t.Fatalf("a file outside region_dir: %v, want ErrOutsideRegionDir", err)
	}
	tab.Close()
	if m.Region.Bytes() != nil {
		t.Fatal("Close left the region mapped")
	}
	if _, err := d.Open(inside, l); err == nil {
		t.Fatal("the Dir still opens files after the table's Close")
	}
}
