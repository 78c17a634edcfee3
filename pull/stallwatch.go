package pull

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/connex/connex/clock"
)

// errStalled is the cause with which a stallWatch cancels a pull's reads.
var errStalled = errors.New("no bytes landed")

// stallWatch is a pull's stall deadline measured on progress: reads whose
// backend reports bytes as they land (Caps.Progress, Endpoint.GetProgress) are
// canceled once nothing has landed for stall, however long the whole read
// takes. A batch deadline instead (what endpoints without progress get)
// fails a pull whose bytes keep flowing but slower than a batch per stall:
// 64 MiB/s per pull with two 32 MiB batches in flight, which many pulls
// sharing a 10 GbE link of one prefill host fall below.
type stallWatch struct {
	clk    clock.Clock
	stall  time.Duration
	last   atomic.Int64  // UnixNano of the last progress, or of the start
	landed atomic.Uint64 // bytes reported
}

func newStallWatch(clk clock.Clock, stall time.Duration) *stallWatch {
	w := &stallWatch{clk: clk, stall: stall}
	w.last.Store(clk.Now().UnixNano())
	return w
}

// progress records that n more bytes landed (Endpoint.GetProgress's callback).
func (w *stallWatch) progress(n int) {
	w.last.Store(w.clk.Now().UnixNano())
	w.landed.Add(uint64(n))
}

// stalledAt reports whether, at now, nothing has landed for the stall time.
func (w *stallWatch) stalledAt(now time.Time) bool {
	return now.UnixNano()-w.last.Load() >= int64(w.stall)
}

// start cancels with errStalled once stalledAt holds: a timer set for the
// moment the stall deadline would pass since the last progress, set again
// from the newer progress when it fires early. stop disarms it; the watch
// never cancels after stop returned.
func (w *stallWatch) start(cancel context.CancelCauseFunc) (stop func()) {
	var (
		mu      sync.Mutex
		t       clock.Timer
		stopped bool
		check   func()
	)
	check = func() {
		now := w.clk.Now()
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if w.stalledAt(now) {
			cancel(errStalled)
			return
		}
		t = w.clk.AfterFunc(time.Duration(w.last.Load()+int64(w.stall)-now.UnixNano()), check)
	}
	mu.Lock()
	t = w.clk.AfterFunc(w.stall, check)
	mu.Unlock()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}
