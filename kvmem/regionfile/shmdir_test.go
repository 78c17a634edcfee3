package regionfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/connex/connex/kvmem"
)

// Which pages a shm_dir's file system gives.
func TestShmDirPages(t *testing.T) {
	for _, c := range []struct{ fstype, opts, want string }{
		{"tmpfs", "rw,relatime,size=4194304k,huge=always", "2MiB"},
		{"tmpfs", "rw,huge=within_size", "2MiB"},
		{"tmpfs", "rw,huge=advise", "4KiB"},
		{"tmpfs", "rw,relatime", "4KiB"},
		{"hugetlbfs", "rw,pagesize=2M", "2MiB"},
		{"ext4", "rw,huge=always", "4KiB"},
	} {
		if got := pagesOf(c.fstype, c.opts); got != c.want {
			t.Errorf("pagesOf(%s, %s) = %s, want %s", c.fstype, c.opts, got, c.want)
		}
	}
	if got, err := ShmDirPages(t.TempDir()); err != nil || (got != "4KiB" && got != "2MiB") {
		t.Fatalf("ShmDirPages(temp dir) = %q, %v", got, err)
	}
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ShmDirPages(f); !errors.Is(err, kvmem.ErrRegion) || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("ShmDirPages(a file) = %v, want ErrRegion: not a directory", err)
	}
}
