package requests

import (
	"reflect"
	"testing"
	"time"
)

// TestAdoptions: the requests of departed owners, and of owners absent for
// longer than the grace, go to the least-loaded live members, each with
// the time the coordinator saw its owner leave.
func TestAdoptions(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	left := map[string]time.Time{"d1": t0.Add(1500 * time.Millisecond)}
	departedAt := func(owner string) time.Time { return left[owner] }
	owners := map[string]string{"r1": "d1", "r2": "d1", "r3": "d2", "r4": "gone", "r5": "d9"}
	live := []Candidate{{"d2", 3}, {"d3", 0}, {"d4", 1}}
	for _, c := range []struct {
		name string
		view View
		want []Adoption
	}{
		{
			name: "just joined: only the owner seen leaving is orphaned",
			view: View{Present: map[string]bool{"d2": true, "d3": true, "d4": true}, Departed: map[string]bool{"d1": true}, Watched: 2 * time.Second, Grace: 5 * time.Second},
			want: []Adoption{
				{Request: "r1", DeadOwner: "d1", Target: "d3", DepartedAt: t0.Add(1500 * time.Millisecond)},
				{Request: "r2", DeadOwner: "d1", Target: "d3", DepartedAt: t0.Add(1500 * time.Millisecond)},
			},
		},
		{
			name: "watched past the grace: absent owners are orphaned too, with no departure time",
			view: View{Present: map[string]bool{"d2": true, "d3": true, "d4": true}, Departed: map[string]bool{"d1": true}, Watched: 5 * time.Second, Grace: 5 * time.Second},
			want: []Adoption{
				{Request: "r1", DeadOwner: "d1", Target: "d3", DepartedAt: t0.Add(1500 * time.Millisecond)},
				{Request: "r2", DeadOwner: "d1", Target: "d3", DepartedAt: t0.Add(1500 * time.Millisecond)},
				{Request: "r4", DeadOwner: "gone", Target: "d4"},
				{Request: "r5", DeadOwner: "d9", Target: "d3"},
			},
		},
		{
			name: "a present owner keeps its requests, even if once seen leaving",
			view: View{Present: map[string]bool{"d1": true, "d2": true, "d3": true, "d4": true}, Departed: map[string]bool{}, Watched: time.Hour, Grace: 5 * time.Second},
			want: []Adoption{
				{Request: "r4", DeadOwner: "gone", Target: "d3"},
				{Request: "r5", DeadOwner: "d9", Target: "d3"},
			},
		},
	} {
		got := Adoptions(owners, live, c.view, departedAt)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
	if got := Adoptions(owners, nil, View{Departed: map[string]bool{"d1": true}}, departedAt); len(got) != 0 {
		t.Errorf("no live members: %+v, want none", got)
	}
}

// TestLeftovers: a member adopts, at start, the requests the store says it
// owns and no actor here runs.
func TestLeftovers(t *testing.T) {
	owners := map[string]string{"r3": "m1", "r1": "m1", "r2": "m2", "r4": "m1"}
	running := func(req string) bool { return req == "r4" }
	if got, want := Leftovers(owners, "m1", running), []string{"r1", "r3"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Leftovers = %v, want %v", got, want)
	}
	if got := Leftovers(owners, "m9", running); len(got) != 0 {
		t.Errorf("a member that owns nothing: %v", got)
	}
}
