package e2e

import (
	"os"
	"testing"
)

// missing skips a test whose dependency (msg says which, and how to get it)
// this machine lacks — or fails it when CONNEX_REQUIRE_DEPS is set, as CI
// sets it after installing every dependency: there a skip would hide a
// broken install step behind a green run.
func missing(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("CONNEX_REQUIRE_DEPS") != "" {
		t.Fatalf("CONNEX_REQUIRE_DEPS is set and a dependency is missing: %s", msg)
	}
	t.Skip(msg)
}
