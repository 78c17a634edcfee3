package api

import (
	"testing"
	"time"
)

func TestDropLogOncePerEngineAMinute(t *testing.T) {
	var d dropLog
	t0 := time.Unix(1000, 0)
	if n, ok := d.note("e1", t0); !ok || n != 1 {
		t.Fatalf("first drop: %d %v, want logged covering 1", n, ok)
	}
	for i := 1; i <= 5; i++ {
		if _, ok := d.note("e1", t0.Add(time.Duration(i)*time.Second)); ok {
			t.Fatalf("drop %d within the minute was logged", i)
		}
	}
	if n, ok := d.note("e2", t0.Add(time.Second)); !ok || n != 1 {
		t.Fatalf("another engine's first drop: %d %v", n, ok)
	}
	if n, ok := d.note("e1", t0.Add(dropLogEvery)); !ok || n != 6 {
		t.Fatalf("a minute on: %d %v, want logged covering the 5 silent ones and this", n, ok)
	}
}
