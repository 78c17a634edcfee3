package daemon

import (
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
)

// A rejoin that fails is tried again until it succeeds: no second eviction
// comes to ask, and a member left out of the cluster would look healthy.
func TestRejoinRetriesUntilItSucceeds(t *testing.T) {
	m := &clusterMembers{log: slog.New(slog.NewTextHandler(io.Discard, nil)), rejoins: make(chan struct{}, 1), done: make(chan struct{})}
	var calls atomic.Int32
	start := func() error {
		if calls.Add(1) < 3 {
			return errors.New("nats: flush timeout")
		}
		return nil
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		m.rejoinLoop(start, time.Millisecond, 4*time.Millisecond)
	}()
	m.rejoins <- struct{}{}
	poll.Until(t, 10*time.Second, time.Millisecond, func() error {
		if n := calls.Load(); n < 3 {
			return errors.New("the rejoin was tried fewer than three times")
		}
		return nil
	})
	close(m.done)
	<-ended
	if n := calls.Load(); n != 3 {
		t.Fatalf("start called %d times; want 3 (two failures, then the success ends the retries)", n)
	}
}
