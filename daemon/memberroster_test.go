package daemon

import (
	"testing"
	"time"

	"github.com/connex/connex/cluster"
)

// stepClock is a time that tests move by hand.
type stepClock struct{ t time.Time }

func (c *stepClock) now() time.Time { return c.t }

func member(name string, role cluster.Role) cluster.Member {
	return cluster.Member{ID: name + "-id", Name: name, Role: role}
}

func TestMemberViewOnJoinAndLeave(t *testing.T) {
	clk := &stepClock{t: time.Unix(1000, 0)}
	r := newMemberRoster("m1", 5*time.Second, clk.now)
	self, m2 := member("m1", cluster.RoleDecode), member("m2", cluster.RoleDecode)
	r.observe(cluster.Event{Type: cluster.EventJoined, Member: m2})
	v := r.view([]cluster.Member{self, m2})
	if !v.Present["m2"] || v.Departed["m2"] || v.Settled["m2"] || v.Settled["m1"] {
		t.Fatalf("just joined: %+v; want m2 present, not departed, nobody settled", v)
	}
	clk.t = clk.t.Add(5 * time.Second)
	if v := r.view([]cluster.Member{self, m2}); !v.Settled["m2"] || !v.Settled["m1"] {
		t.Fatalf("after the grace: %+v; want both settled", v)
	}
	clk.t = clk.t.Add(time.Second)
	left := clk.t
	r.observe(cluster.Event{Type: cluster.EventLeft, Member: m2, Reason: cluster.ReasonBlocked})
	clk.t = clk.t.Add(time.Second)
	v = r.view([]cluster.Member{self})
	if v.Present["m2"] || !v.Departed["m2"] || !r.departedAt("m2").Equal(left) {
		t.Fatalf("after m2 left: %+v, departed at %v; want m2 departed at %v", v, r.departedAt("m2"), left)
	}
	// Back again: no longer departed, and its tenure starts afresh.
	r.observe(cluster.Event{Type: cluster.EventJoined, Member: m2})
	v = r.view([]cluster.Member{self, m2})
	if v.Departed["m2"] || !v.Present["m2"] || v.Settled["m2"] || !r.departedAt("m2").IsZero() {
		t.Fatalf("after m2 came back: %+v; want present, not departed, not settled", v)
	}
	// A rejoin of this member forgets every sighting.
	r.observe(cluster.Event{Type: cluster.EventLeft, Member: m2})
	r.rejoin()
	if v := r.view([]cluster.Member{self}); len(v.Departed) != 0 || v.Settled["m1"] {
		t.Fatalf("after a rejoin: %+v; want nothing departed and this member unsettled", v)
	}
}

func TestLeftForGood(t *testing.T) {
	m2 := member("m2", cluster.RoleDecode)
	left := cluster.Event{Type: cluster.EventLeft, Member: m2}
	if !leftForGood(left, "m1", nil) {
		t.Fatal("m2 left and nobody carries its name: not a departure")
	}
	restarted := m2
	restarted.ID = "m2-new"
	if leftForGood(left, "m1", []cluster.Member{restarted}) {
		t.Fatal("a late departure of m2's old incarnation counted while the new one is live")
	}
	if leftForGood(cluster.Event{Type: cluster.EventLeft, Member: member("m1", cluster.RoleDecode)}, "m1", nil) {
		t.Fatal("this member's own departure counted")
	}
	if leftForGood(cluster.Event{Type: cluster.EventJoined, Member: m2}, "m1", nil) {
		t.Fatal("a join counted as a departure")
	}
}

func TestDecodeCandidates(t *testing.T) {
	suspect := member("m3", cluster.RoleDecode)
	suspect.Suspect = true
	got := decodeCandidates([]cluster.Member{member("m1", cluster.RoleDecode), member("p1", cluster.RolePrefill), suspect, {ID: "x", Role: cluster.RoleDecode}})
	if len(got) != 1 || got[0].ID != "m1" {
		t.Fatalf("candidates %+v, want m1 only (no prefill, suspect or unnamed member)", got)
	}
}
