// Package memcopy copies bulk data that the copying CPU will not read again:
// pulled KV blocks, which the decode engine consumes later, from another
// process or a device.
//
// A plain copy (Go's copy, glibc's memcpy) writes through the cache below
// about 1 MiB per call. Each destination line is then first read from memory
// (read for ownership) and later written back, so a copy of many small
// pieces moves three bytes over the memory bus for each byte copied, where a
// copy with non-temporal stores moves two. On a Xeon-class 2-core VM
// (bench-pull, earlier sessions) 4096 scattered pieces of 32 KiB copied at
// 0.55–0.66 of the speed of a contiguous 256 MiB copy with plain stores, and
// at 0.87–0.98 of it with streaming stores.
//
// On an AMD Zen 5 2-core VM (2026-12-01) the 32-byte AVX2 loop copied the
// same pieces 15–20% faster than the SSE2 one, and a lone 32 KiB copy still
// spent a measurable share of its time waiting for its first lines:
// StreamPairUnfenced, which interleaves two copies line by line, copied them
// 17–35% faster than one at a time (BenchmarkPieces: pairs/unfenced).
//
// Stream, StreamUnfenced and StreamPairUnfenced use non-temporal stores on
// amd64 (AVX2 where the CPU has it, else SSE2, present on every amd64 CPU)
// and fall back to copy elsewhere; a run of unfenced copies ends with one
// Fence. InterleaveUnfenced writes lines whose two 32-byte halves come from
// two sources (vLLM's CPU-order K rows when two blocks make one) the same
// way, and declines elsewhere so that the caller interleaves itself. Pure Go and assembly, no cgo; the race detector sees the copies
// (race.go reports them).
package memcopy
