// Package layering holds the test that keeps the code's imports to the
// package table of ARCHITECTURE.md: which package may import which, which
// external modules each may use, which may do I/O, and that cgo lives in
// transport/ucx alone. It has no code of its own.
package layering
