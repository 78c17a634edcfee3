package actors

import (
	"context"
	"errors"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// descriptorsRetrying asks for a pull's descriptors until ctx ends (the
// stall deadline), again when the holder's member was between NATS servers:
// "no responders" (nothing was received; its NATS server died and it is
// reconnecting to the next one), or no answer within a third of stall (the
// request or its answer was lost with the server). Asking again is safe:
// the holder treats a start of a running pull by the same reader as the
// same pull (lease.PullStart). Every other answer, an error included, ends
// it.
func descriptorsRetrying(ctx context.Context, stall time.Duration, ask func(context.Context) (*messages.Descriptors, error)) (*messages.Descriptors, error) {
	attempt := max(stall/3, 50*time.Millisecond)
	pause := time.NewTimer(0)
	<-pause.C
	defer pause.Stop()
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		d, err := ask(actx)
		timedOut := actx.Err() != nil
		cancel()
		if err == nil || ctx.Err() != nil || !(errors.Is(err, nats.ErrNoResponders) || api.CodeOf(err) == api.CodeTimeout && timedOut) {
			return d, err
		}
		// No responders comes back at once: pace the next try.
		pause.Reset(25 * time.Millisecond)
		select {
		case <-pause.C:
		case <-ctx.Done():
			return nil, err
		}
	}
}
