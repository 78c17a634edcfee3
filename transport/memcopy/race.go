//go:build race

package memcopy

import (
	"runtime"
	"unsafe"
)

// raceCopy tells the race detector about the assembly copy, which it
// cannot see: a read of src and a write of dst, as copy would report.
func raceCopy(dst, src []byte) {
	runtime.RaceReadRange(unsafe.Pointer(unsafe.SliceData(src)), len(src))
	runtime.RaceWriteRange(unsafe.Pointer(unsafe.SliceData(dst)), len(dst))
}
