package memcopy

import "unsafe"

const haveStream = true

// streamLines copies n bytes (a multiple of 64, n > 0) from src to dst with
// non-temporal stores and ends with SFENCE. dst must be 64-byte aligned.
//
//go:noescape
func streamLines(dst, src *byte, n uintptr)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
