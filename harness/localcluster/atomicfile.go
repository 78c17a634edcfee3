package localcluster

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
)

// writeFileAtomic writes data to a temporary file beside path and renames
// it over path, so a reader (a shell, Prometheus) never sees half a file.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("localcluster: write %s: %w", path, err)
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := cmp.Or(werr, cerr, os.Chmod(f.Name(), perm)); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("localcluster: write %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("localcluster: write %s: %w", path, err)
	}
	return nil
}
