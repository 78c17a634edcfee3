//go:build ucx && cgo

package ucx

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// TestAwaitSettlesABatchTheStoppedLoopNeverRan: a Get whose closure was
// queued after the worker's loop last looked at its commands (a Get racing
// Backend.Close) gets ErrClosed when the loop stops, with or without a
// deadline, instead of waiting forever for a result nobody sends.
func TestAwaitSettlesABatchTheStoppedLoopNeverRan(t *testing.T) {
	for _, canceled := range []bool{false, true} {
		w := &worker{done: make(chan struct{})}
		bt := &batch{result: make(chan error, 1)}
		ctx, cancel := context.WithCancel(context.Background())
		if canceled {
			cancel() // the cancel's own submit then finds the loop stopped
		}
		errc := make(chan error, 1)
		go func() { errc <- w.await(ctx, bt) }()
		close(w.done)
		select {
		case err := <-errc:
			if !errors.Is(err, transport.ErrClosed) {
				t.Fatalf("canceled=%v: %v, want ErrClosed", canceled, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("canceled=%v: await still waits for a batch the stopped loop never ran", canceled)
		}
		cancel()
	}
	// A batch the loop ran has its result: that is the outcome.
	w := &worker{done: make(chan struct{})}
	bt := &batch{result: make(chan error, 1)}
	bt.result <- nil
	close(w.done)
	if err := w.settleStopped(bt); err != nil {
		t.Fatalf("a batch that completed: %v", err)
	}
}
