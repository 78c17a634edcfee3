package actors

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// descAsks is how a puller asks for its descriptors: post sends one more
// ask without waiting for it, and the answers of every ask arrive on
// answers, in the order they come, for decode to read (api.Asks: the NATS
// connection's reader delivers them, no goroutine per ask).
type descAsks[T any] struct {
	post    func() error
	answers <-chan T
	decode  func(T) (*messages.Descriptors, error)
}

// descriptorsRetrying waits for a pull's descriptors until ctx ends (the
// stall deadline), and asks again when the holder's member may be between
// NATS servers: soon after "no responders" (nothing was received; its NATS
// server died and it is reconnecting to the next one), and alongside an ask
// unanswered for a third of stall (the request or its answer may have been
// lost with the server). Earlier asks stay outstanding, so a holder that is
// merely slow still answers in time; the first answer wins. Asking again
// is safe: the holder treats a start of a running pull by the same reader
// as the same pull (lease.PullStart). posted says the first ask was sent
// already (StartPuller sends it before the puller runs); clk paces the
// re-asks, from when this is called.
func descriptorsRetrying[T any](ctx context.Context, clk clock.Clock, stall time.Duration, asks descAsks[T], posted bool) (*messages.Descriptors, error) {
	if !posted {
		if err := asks.post(); err != nil {
			return nil, err
		}
	}
	alongside := max(stall/3, 50*time.Millisecond)
	next, nextC := clk.NewTimer(alongside)
	defer next.Stop()
	var last error
	for {
		select {
		case m := <-asks.answers:
			d, err := asks.decode(m)
			if err == nil || !errors.Is(err, nats.ErrNoResponders) {
				return d, err // descriptors, or the holder's error
			}
			last = err
			next.Reset(25 * time.Millisecond) // no responders comes back at once: pace the next ask
		case <-nextC:
			if err := asks.post(); err != nil {
				return nil, err
			}
			next.Reset(alongside)
		case <-ctx.Done():
			if err := ctx.Err(); !errors.Is(err, context.DeadlineExceeded) {
				// Canceled (connexd stopping, the holder left): the
				// caller says why; never a timeout.
				return nil, fmt.Errorf("peer.descriptors: %w", err)
			}
			if last == nil {
				last = api.Errorf(api.CodeTimeout, "peer.descriptors: %v", ctx.Err())
			}
			return nil, last
		}
	}
}
