package regionfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/connex/connex/kvmem"
	"golang.org/x/sys/unix"
)

// Dir confines the region files engines register (region.register)
// to one directory: paths are resolved beneath it without following
// symbolic links or crossing mounts (openat2 RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV), and the file must be a regular
// file owned by an allowed user (connexd's own by default). A root connexd
// thus cannot be made to open another user's file.
//
// A Dir is a kvmem.RegionOpener: kvmem.NewRegionTable(dir) maps only the
// files it allows, and the table's Close closes it.
type Dir struct {
	root string
	dir  *os.File
	uids map[int]bool
}

// OpenDir opens root (it must exist; symbolic links in root itself
// are resolved once, here) allowing files owned by uids, or by this
// process's effective user when uids is empty.
func OpenDir(root string, uids []int) (*Dir, error) {
	abs, err := filepath.Abs(root)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: region_dir %s: %w", kvmem.ErrRegion, root, err)
	}
	f, err := os.Open(abs)
	if err != nil {
		return nil, fmt.Errorf("%w: region_dir %s: %w", kvmem.ErrRegion, root, err)
	}
	if st, err := f.Stat(); err != nil || !st.IsDir() {
		f.Close()
		return nil, fmt.Errorf("%w: region_dir %s is not a directory", kvmem.ErrRegion, root)
	}
	d := &Dir{root: abs, dir: f, uids: map[int]bool{}}
	for _, u := range uids {
		d.uids[u] = true
	}
	if len(d.uids) == 0 {
		d.uids[os.Geteuid()] = true
	}
	return d, nil
}

// Root is the confining directory (absolute, links resolved).
func (d *Dir) Root() string { return d.root }

// Close releases the directory.
func (d *Dir) Close() error { return d.dir.Close() }

// Open maps the region file at path (absolute, beneath Root), as the
// package's Open does, refusing (kvmem.ErrOutsideRegionDir) any other.
func (d *Dir) Open(path string, layout kvmem.Layout) (*kvmem.Region, error) {
	if err := layout.Validate(); err != nil {
		return nil, err
	}
	refuse := func(why string) error {
		return fmt.Errorf("%w: %s: %s (region_dir is %s)", kvmem.ErrOutsideRegionDir, path, why, d.root)
	}
	if !filepath.IsAbs(path) {
		return nil, refuse("not an absolute path")
	}
	rel, err := filepath.Rel(d.root, filepath.Clean(path))
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return nil, refuse("not beneath region_dir")
	}
	fd, err := unix.Openat2(int(d.dir.Fd()), rel, &unix.OpenHow{
		Flags:   unix.O_RDWR | unix.O_CLOEXEC | unix.O_NOFOLLOW | unix.O_NOCTTY | unix.O_NONBLOCK,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, refuse("no such file")
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return nil, refuse("the path goes through a symbolic link or another mount")
	case errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENXIO):
		return nil, refuse("not a regular file")
	case err != nil:
		return nil, refuse(fmt.Sprintf("cannot open it: %v", err))
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, refuse(fmt.Sprintf("cannot stat it: %v", err))
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, refuse("not a regular file")
	}
	if !d.uids[int(st.Uid)] {
		return nil, refuse(fmt.Sprintf("owned by uid %d, not an allowed region owner", st.Uid))
	}
	if uint64(st.Size) != layout.Size() {
		return nil, fmt.Errorf("%w: %s is %d bytes but the layout needs %d", kvmem.ErrBadLayout, path, st.Size, layout.Size())
	}
	return mapFile(f, path, layout)
}
