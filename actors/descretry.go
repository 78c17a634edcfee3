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

// descriptorsRetrying asks for a pull's descriptors until ctx ends (the
// stall deadline), and asks again when the holder's member may be between
// NATS servers: soon after "no responders" (nothing was received; its NATS
// server died and it is reconnecting to the next one), and alongside an ask
// unanswered for a third of stall (the request or its answer may have been
// lost with the server). Earlier asks stay outstanding, so a holder that is
// merely slow still answers in time; the first answer wins. Asking again
// is safe: the holder treats a start of a running pull by the same reader
// as the same pull (lease.PullStart). clk paces the re-asks.
func descriptorsRetrying(ctx context.Context, clk clock.Clock, stall time.Duration, ask func(context.Context) (*messages.Descriptors, error)) (*messages.Descriptors, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the asks still outstanding
	type answer struct {
		d   *messages.Descriptors
		err error
	}
	answers := make(chan answer)
	send := func() {
		go func() {
			d, err := ask(ctx)
			select {
			case answers <- answer{d, err}:
			case <-ctx.Done():
			}
		}()
	}
	alongside := max(stall/3, 50*time.Millisecond)
	next, nextC := clk.NewTimer(alongside)
	defer next.Stop()
	send()
	var last error
	for {
		select {
		case a := <-answers:
			if a.err == nil || !errors.Is(a.err, nats.ErrNoResponders) {
				return a.d, a.err // descriptors, or the holder's error, or ctx's end
			}
			last = a.err
			next.Reset(25 * time.Millisecond) // no responders comes back at once: pace the next ask
		case <-nextC:
			send()
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
