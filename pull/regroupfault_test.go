package pull

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/connex/connex/transport"
)

// TestRegroupFaultingTurnsAShrunkFileIntoErrFault: a store into a mapping
// whose file was truncated (SIGBUS) fails the regroup with ErrFault, and
// the process goes on; a store that does not fault returns nil, and a
// panic that is not a fault stays a panic.
func TestRegroupFaultingTurnsAShrunkFileIntoErrFault(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "region"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 1 << 16
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	if err := regroupFaulting(func() { mem[size-1] = 1 }); err != nil {
		t.Fatalf("a store into the mapped file: %v", err)
	}
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	err = regroupFaulting(func() { mem[size-1] = 2 })
	if !errors.Is(err, transport.ErrFault) {
		t.Fatalf("a store into a truncated file's mapping: %v, want ErrFault", err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a panic that is not a fault was swallowed")
		}
	}()
	_ = regroupFaulting(func() { panic("a bug") })
}
