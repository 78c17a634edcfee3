package regionfile

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/connex/connex/kvmem"
)

// ShmDirPages checks that dir can hold created regions' memory (shm_dir)
// and says which pages it gives them: "2MiB" on a tmpfs mounted with
// huge=always or huge=within_size, or on hugetlbfs, else "4KiB" (a tmpfs
// with huge=never or advise, or any other file system). It reads
// /proc/self/mounts; the error names what is wrong with dir.
func ShmDirPages(dir string) (string, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return "", fmt.Errorf("%w: shm_dir: %w", kvmem.ErrRegion, err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%w: shm_dir %s is not a directory", kvmem.ErrRegion, dir)
	}
	abs, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", fmt.Errorf("%w: shm_dir: %w", kvmem.ErrRegion, err)
	}
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return "", fmt.Errorf("%w: shm_dir: %w", kvmem.ErrRegion, err)
	}
	defer f.Close()
	var best, fstype, opts string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// device mountpoint fstype options dump pass
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 {
			continue
		}
		mp := fs[1]
		if (abs == mp || strings.HasPrefix(abs, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(best) {
			best, fstype, opts = mp, fs[2], fs[3]
		}
	}
	return pagesOf(fstype, opts), nil
}

// pagesOf is the page size a file system of fstype mounted with opts gives
// files on it.
func pagesOf(fstype, opts string) string {
	switch fstype {
	case "hugetlbfs":
		return "2MiB"
	case "tmpfs":
		for _, o := range strings.Split(opts, ",") {
			if o == "huge=always" || o == "huge=within_size" {
				return "2MiB"
			}
		}
	}
	return "4KiB"
}
