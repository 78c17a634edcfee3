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
