package transport

import (
	"fmt"
	"testing"
)

func TestJoinAdjacent(t *testing.T) {
	for _, c := range []struct{ in, want []Extent }{
		{nil, []Extent{}},
		{[]Extent{{0, 4}}, []Extent{{0, 4}}},
		{[]Extent{{0, 4}, {4, 4}, {8, 2}}, []Extent{{0, 10}}},
		{[]Extent{{0, 4}, {5, 4}, {9, 1}, {20, 1}}, []Extent{{0, 4}, {5, 5}, {20, 1}}},
	} {
		got := JoinAdjacent(c.in)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("JoinAdjacent(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestPeriodicExtents: a hold's extents (the same runs a plane apart) come
// out as one period; anything else stays as given; Allows answers as a
// search of the full list would, across periods too.
func TestPeriodicExtents(t *testing.T) {
	var hold []Extent
	for k := uint64(0); k < 4; k++ {
		hold = append(hold, Extent{Off: 100 + k*1000, Len: 50}, Extent{Off: 300 + k*1000, Len: 200})
	}
	for _, c := range []struct {
		name            string
		in              []Extent
		runs            int
		stride, periods uint64
	}{
		{"hold", hold, 2, 1000, 4},
		{"one", []Extent{{Off: 5, Len: 5}}, 1, 0, 1},
		{"none", nil, 0, 0, 1},
		{"uneven lengths", []Extent{{Off: 0, Len: 10}, {Off: 100, Len: 20}}, 2, 0, 1},
		{"uneven strides", []Extent{{Off: 0, Len: 10}, {Off: 100, Len: 10}, {Off: 250, Len: 10}}, 3, 0, 1},
		{"two periods of three", []Extent{{0, 1}, {2, 1}, {5, 1}, {10, 1}, {12, 1}, {15, 1}}, 3, 10, 2},
	} {
		p := NewPeriodicExtents(c.in)
		if len(p.Runs) != c.runs || p.Stride != c.stride || p.Periods != c.periods {
			t.Errorf("%s: %d runs, stride %d, %d periods; want %d, %d, %d", c.name, len(p.Runs), p.Stride, p.Periods, c.runs, c.stride, c.periods)
		}
		// Against the plain list, every range in and around the extents.
		for off := uint64(0); off < 5000; off += 7 {
			for _, n := range []uint64{1, 10, 49, 50, 51, 200, 900} {
				want := false
				for _, e := range c.in {
					if off >= e.Off && off+n <= e.Off+e.Len {
						want = true
					}
				}
				if got := p.Allows(off, n); got != want {
					t.Fatalf("%s: Allows(%d, %d) = %v, want %v", c.name, off, n, got, want)
				}
			}
		}
	}
}
