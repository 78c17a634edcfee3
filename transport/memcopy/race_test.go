//go:build race

package memcopy

import (
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

// TestStreamIsRaceInstrumented: the race detector cannot see inside the
// assembly copy, so Stream reports its reads and writes itself. A child
// process streams into a buffer that another goroutine reads without
// synchronisation, through the assembly path only (aligned, whole lines);
// the race detector must report it.
func TestStreamIsRaceInstrumented(t *testing.T) {
	if os.Getenv("MEMCOPY_RACY_CHILD") == "1" {
		racyStream()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestStreamIsRaceInstrumented$", "-test.count=1")
	cmd.Env = append(os.Environ(), "MEMCOPY_RACY_CHILD=1")
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "DATA RACE") {
		t.Fatalf("the race detector did not see a racy Stream; child output:\n%s", out)
	}
}

func racyStream() {
	buf := make([]byte, 8192+64)
	off := int(-uintptr(unsafe.Pointer(&buf[0])) & 63)
	dst := buf[off : off+8192]
	src := make([]byte, len(dst))
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); Stream(dst, src) }()
	go func() { defer wg.Done(); _ = dst[4096] }()
	wg.Wait()
}
