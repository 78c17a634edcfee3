// Package layering holds the tests that keep the code to ARCHITECTURE.md's
// floor plan and package table: every folder has its place and side
// (runtime, engine/, harness/, cmd/), a side imports only the sides below
// it, which package may import which, which external modules each may use,
// which may do I/O, that cgo lives in transport/ucx alone, and that every
// exported name has a doc comment. It has no code of its own.
package layering
