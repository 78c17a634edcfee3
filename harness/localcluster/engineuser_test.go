package localcluster

import (
	"math"
	"testing"
)

// TestEachEngineGetsItsOwnUID: under Options.EngineUser every engine runs
// under a uid of its own (the base plus its start index), the same across
// its restarts, so no engine can read another's engine.creds.
func TestEachEngineGetsItsOwnUID(t *testing.T) {
	c := &Cluster{opts: Options{EngineUser: &User{UID: 70000, GID: 71000}}}
	seen := map[uint32]string{}
	for _, name := range []string{"prefill-0", "decode-0", "decode-1"} {
		u, err := c.engineUser(name)
		if err != nil {
			t.Fatal(err)
		}
		if other, ok := seen[u.UID]; ok {
			t.Fatalf("%s and %s share uid %d", name, other, u.UID)
		}
		seen[u.UID] = name
	}
	again, err := c.engineUser("decode-0")
	if err != nil || again.UID != 70001 || again.GID != 71001 {
		t.Fatalf("decode-0 restarted as %+v (%v), want uid 70001 gid 71001 as before", again, err)
	}
	if u := c.EngineUser("decode-1"); u == nil || u.UID != 70002 {
		t.Fatalf("EngineUser(decode-1) = %+v, want uid 70002", u)
	}
	if u, err := (&Cluster{}).engineUser("x"); u != nil || err != nil {
		t.Fatalf("without EngineUser: %+v, %v; want the launcher's own user", u, err)
	}
	top := &Cluster{opts: Options{EngineUser: &User{UID: math.MaxUint32 - 1, GID: 1}}}
	if _, err := top.engineUser("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := top.engineUser("b"); err == nil {
		t.Fatal("an engine uid past the largest was accepted ((uid_t)-1 means no uid)")
	}
}
