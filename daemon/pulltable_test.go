package daemon

import (
	"fmt"
	"testing"
	"time"
)

func TestPullTableStartsAPullOnce(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tb := newPullTable()
	if claimed, _ := tb.claim("e1", "p1", "t1", t0); !claimed {
		t.Fatal("a new pull id is not claimed")
	}
	// Sent again while it runs: the same pull.
	if claimed, same := tb.claim("e1", "p1", "t1", t0); claimed || !same {
		t.Fatalf("running: claimed %v same %v, want the same pull", claimed, same)
	}
	// Another engine or transfer with that id: not the same pull.
	if claimed, same := tb.claim("e2", "p1", "t1", t0); claimed || same {
		t.Fatalf("another engine: claimed %v same %v", claimed, same)
	}
	tb.done("p1", t0.Add(time.Second))
	if tb.Len() != 0 || len(tb.of("")) != 0 {
		t.Fatalf("an ended pull still listed as running: %v", tb.of(""))
	}
	// Sent again after it ended (its first answer was lost): still the
	// same pull, not a second one writing the engine's blocks.
	if claimed, same := tb.claim("e1", "p1", "t1", t0.Add(10*time.Second)); claimed || !same {
		t.Fatalf("ended: claimed %v same %v, want the same pull (not started again)", claimed, same)
	}
	// A minute on it is forgotten.
	if claimed, _ := tb.claim("e1", "p1", "t1", t0.Add(time.Second+endedPullTTL+time.Millisecond)); !claimed {
		t.Fatal("an id ended over endedPullTTL ago is not free again")
	}
	// A pull refused before it ran is forgotten at once: sending it again starts it.
	tb.claim("e1", "p2", "t1", t0)
	tb.forget("p2")
	if claimed, _ := tb.claim("e1", "p2", "t1", t0); !claimed {
		t.Fatal("a refused pull's id is not free again")
	}
}

func TestPullTableRemembersBoundedly(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tb := newPullTable()
	for i := range endedPullMax + 10 {
		id := fmt.Sprint("p", i)
		tb.claim("e", id, "t", t0)
		tb.done(id, t0)
	}
	if len(tb.ended) != endedPullMax || len(tb.order) != endedPullMax {
		t.Fatalf("remembers %d (%d in order), want at most %d", len(tb.ended), len(tb.order), endedPullMax)
	}
	if claimed, _ := tb.claim("e", "p0", "t", t0); !claimed {
		t.Fatal("the oldest ended pull was not the one dropped")
	}
}
