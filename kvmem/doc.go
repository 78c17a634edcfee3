// Package kvmem describes and maps the memory that holds KV blocks.
//
// A region is a file (normally under /dev/shm) that the engine creates and
// both the engine and connexd map shared. Its Layout fixes where every block
// of every layer and plane lies; Extents turns a list of block ids into the
// few contiguous byte ranges the data plane registers and reads. A
// BlockTable keeps per-block accounting (held by holds, being read by pulls,
// being written by pulls) so that misuse — a block freed twice, a
// destination block written by two pulls at once — is caught and reported
// instead of corrupting an engine's cache.
//
// Everything here is deterministic and free of actors and sockets; the
// actors package wires it.
package kvmem
