//go:build !chaosplant

package router

// planted reports whether a bug was planted for the chaos harness's own
// tests; only binaries built with -tags chaosplant can have one.
func planted(string) bool { return false }
