package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests/activation"
)

// requestBinder binds a hold to the engine its request runs on now, from
// the request's durable state (the rebind rule, activation.BindCall): the
// holder's side of a call on a hold made for a request, before the hold
// judges the call.
type requestBinder struct {
	holds holdCaller
	store requestStore
	log   *slog.Logger
}

var _ holdBinder = (*requestBinder)(nil)

// holdCaller asks a live hold by transfer id (holdAPI.askHold).
type holdCaller interface {
	askHold(id string, msg any) (actors.Reply, error)
}

// requestStore reads a request's durable state (requests.KVStore): Get
// the whole of it, Head its record without the prompt (requests.Store).
type requestStore interface {
	Get(ctx context.Context, id string) (*messages.RequestState, uint64, error)
	Head(ctx context.Context, id string) (*messages.RequestState, uint64, error)
}

// storeReadTimeout bounds the read of a request's state for a rebind.
const storeReadTimeout = 5 * time.Second

// bind binds the call's hold to its requester if the rebind rule says so
// from the request's stored state; otherwise it leaves the hold as it is
// (the operation that follows is judged by the binding).
func (b *requestBinder) bind(call activation.BindCall) {
	rep, err := b.holds.askHold(call.Transfer, &actors.InspectHold{})
	if err != nil || call.Bound(rep.Consumer, rep.Request) {
		return
	}
	c, cancel := context.WithTimeout(context.Background(), storeReadTimeout)
	defer cancel()
	st, _, gerr := b.store.Head(c, call.Request)
	epoch, ok := call.Rebind(st, gerr)
	if !ok {
		return
	}
	if _, rerr := b.holds.askHold(call.Transfer, &actors.RebindHold{Consumer: call.Requester, Request: call.Request, Epoch: epoch}); rerr != nil {
		b.log.Info("hold not bound to the request's engine", "transfer", call.Transfer, "request", call.Request, "consumer", call.Requester, "epoch", epoch, "err", rerr)
		return
	}
	b.log.Info("hold bound to the request's engine", "transfer", call.Transfer, "request", call.Request, "consumer", call.Requester, "epoch", epoch, "was", rep.Consumer)
}
