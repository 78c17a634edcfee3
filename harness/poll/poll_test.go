package poll

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	Until(t, 10*time.Second, time.Millisecond, func() error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 3 {
		t.Fatalf("condition asked %d times, want 3", calls)
	}
}

// recorder is a testing.TB whose Fatalf records instead of stopping.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper()                           {}
func (r *recorder) Fatalf(format string, args ...any) { r.msg = fmt.Sprintf(format, args...) }

func TestUntilFailsWithTheLastAnswer(t *testing.T) {
	r := &recorder{TB: t}
	Until(r, 5*time.Millisecond, time.Millisecond, func() error { return errors.New("still broken") })
	if !strings.Contains(r.msg, "still broken") {
		t.Fatalf("failure said %q, want the condition's last error", r.msg)
	}
}
