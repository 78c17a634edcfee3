// Package memcopy copies bulk data that the copying CPU will not read again:
// pulled KV blocks, which the decode engine consumes later, from another
// process or a device.
//
// A plain copy (Go's copy, glibc's memcpy) writes through the cache below
// about 1 MiB per call. Each destination line is then first read from memory
// (read for ownership) and later written back, so a copy of many small
// pieces moves three bytes over the memory bus for each byte copied, where a
// copy with non-temporal stores moves two. On this project's reference
// machine a 128 MiB KV pull in 4096 pieces of 32 KiB copied at 0.55–0.75 of
// the speed of one 256 MiB copy with plain stores, and at the same speed
// with Stream.
//
// Stream uses non-temporal stores on amd64 (SSE2, present on every amd64
// CPU) and falls back to copy elsewhere. It is pure Go and assembly: no cgo.
package memcopy
