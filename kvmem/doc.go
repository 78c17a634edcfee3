// Package kvmem decides about the memory that holds KV blocks.
//
// A region is memory the engine and connexd both map shared: a file
// (normally under /dev/shm) the engine creates, or memory connexd creates
// for it. Here a Region is only those bytes and the func that releases
// them; the package kvmem/regionfile makes Regions from files. A region's
// Layout fixes where every block of every layer and plane lies; Extents
// turns a list of block ids into the few contiguous byte ranges the data
// plane registers and reads. A BlockTable keeps per-block accounting (held
// by holds, being read by pulls, being written by pulls) so that misuse —
// a block freed twice, a destination block written by two pulls at once —
// is caught and reported instead of corrupting an engine's cache.
//
// A RegionTable keeps the regions one connexd maps, by engine and id, with
// refcounts and quotas; it opens engines' files through an injected
// RegionOpener (regionfile.Dir).
//
// Everything here is deterministic and free of actors, sockets, files and
// system calls (layering_test.go marks it pure); the actors package wires
// it and kvmem/regionfile does its I/O.
package kvmem
