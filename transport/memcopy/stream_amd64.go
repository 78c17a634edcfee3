package memcopy

import "unsafe"

const haveStream = true

// streamLines copies n bytes (a multiple of 64, n > 0) from src to dst with
// non-temporal stores, without a fence. dst must be 64-byte aligned.
//
//go:noescape
func streamLines(dst, src *byte, n uintptr)

// fence orders the non-temporal stores before it (SFENCE).
func fence()

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
