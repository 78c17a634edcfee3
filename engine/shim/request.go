package shim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// ErrFenced means the request moved to another activation (a takeover
// with a newer epoch): the engine must stop its stream at once.
var ErrFenced = errors.New("shim: request fenced: it runs elsewhere now")

// RequestSpec is what request.start needs.
type RequestSpec struct {
	ID     string                     // request id (kv_transfer_params.connex_request_id, or generated)
	Params *messages.KVTransferParams // the hold to keep alive and release at the end
	Tokens []uint32                   // every token the engine was given (prompt, plus k generated for a resume)
	// Takeover moves an existing request here with the next epoch, fencing
	// the activation that ran it (kv_transfer_params.connex_resume).
	Takeover bool
	// MaxTokens is the request's max_tokens on this engine (for a takeover,
	// what is left of it); connexd refuses progress past it, so a runaway
	// report loop cannot grow the stored request. 0: no bound of its own.
	MaxTokens uint32
}

// Request is one decode request's activation on the engine's connexd. Its
// context ends with cause ErrFenced when the request is fenced.
type Request struct {
	e     *Engine
	id    string
	epoch uint64

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu    sync.Mutex
	batch *progressBatch
	kick  chan struct{}
	stop  chan struct{}
	done  chan struct{}
	lost  bool // fenced, or the request actor is gone (unknown_request): reports stop
	ended bool
}

// StartRequest runs request.start (resume_authority "router": the router
// that streams the request decides where it resumes) and starts the
// request's progress reporter.
func (e *Engine) StartRequest(ctx context.Context, s RequestSpec) (*Request, error) {
	c, cancel := context.WithTimeout(ctx, e.cfg.CallTimeout)
	defer cancel()
	st, err := e.cli.StartRequest(c, &messages.StartRequestMsg{
		RequestId: s.ID, Params: s.Params, PromptTokenIds: s.Tokens, EngineId: e.cfg.EngineID,
		Takeover: s.Takeover, ResumeAuthority: "router", MaxTokens: s.MaxTokens,
	})
	if err != nil {
		return nil, fmt.Errorf("engine %s: request.start of %s (takeover %v) on member %s: %w", e.cfg.EngineID, s.ID, s.Takeover, e.cfg.Member, err)
	}
	r := &Request{
		e: e, id: s.ID, epoch: st.GetState().GetEpoch(),
		batch: newProgressBatch(e.cfg.ProgressEvery, e.cfg.ProgressDelay, e.cfg.ProgressInterval),
		kick:  make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	r.ctx, r.cancel = context.WithCancelCause(context.Background())
	e.mu.Lock()
	e.requests[s.ID] = r
	e.mu.Unlock()
	go r.report()
	return r, nil
}

// ID is the request id.
func (r *Request) ID() string { return r.id }

// Epoch is the activation's epoch (from the request.start reply).
func (r *Request) Epoch() uint64 { return r.epoch }

// Context ends when the request is fenced (cause ErrFenced) or finished.
func (r *Request) Context() context.Context { return r.ctx }

// Report queues generated tokens for request.progress; it never blocks on
// the network.
func (r *Request) Report(toks ...uint32) {
	now := time.Now()
	r.mu.Lock()
	if r.lost { // reports stopped: nothing would send these
		r.mu.Unlock()
		return
	}
	// The reporter needs waking only when its plan changes: a call due
	// now, or a wake-up sooner than the one its timer waits for (the first
	// token's, or the interval's end once enough tokens wait). Kicking it
	// for every token would wake a goroutine per token on the engine's
	// token path. A call in flight: the reporter looks again when it ends.
	before := r.batch.wake()
	r.batch.add(now, toks...)
	after := r.batch.wake()
	wake := r.batch.due(now) || (!after.IsZero() && (before.IsZero() || after.Before(before)))
	r.mu.Unlock()
	if !wake {
		return
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// report sends batches until stopped; at most one call in flight.
func (r *Request) report() {
	defer close(r.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		r.mu.Lock()
		now := time.Now()
		var send []uint32
		if !r.lost && r.batch.due(now) {
			send = r.batch.take(now)
		}
		wake := r.batch.wake()
		r.mu.Unlock()
		if send != nil {
			err := r.progress(send)
			r.mu.Lock()
			r.batch.done(time.Now(), send, err != nil)
			r.mu.Unlock()
			continue
		}
		wait := time.Hour
		if !wake.IsZero() {
			wait = max(time.Until(wake), time.Millisecond)
		}
		t.Reset(wait)
		select {
		case <-r.stop:
			return
		case <-r.kick:
		case <-t.C:
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
	}
}

func (r *Request) progress(toks []uint32) error {
	c, cancel := context.WithTimeout(context.Background(), r.e.cfg.CallTimeout)
	defer cancel()
	_, err := r.e.cli.Progress(c, &messages.RequestProgress{RequestId: r.id, Epoch: r.epoch, TokenIds: toks})
	switch api.CodeOf(err) {
	case 0:
		return nil
	case api.CodeFenced:
		r.e.log.Warn("request fenced: stopping its stream", "request", r.id, "epoch", r.epoch, "err", err)
		r.cancel(fmt.Errorf("%w (request.progress: %v)", ErrFenced, err))
		r.stopReports()
		return nil
	case api.CodeUnknownRequest:
		// The request actor is gone (its connexd restarted): the stream
		// goes on, unchecked; a resume would start it afresh.
		r.e.log.Warn("request no longer known to its connexd: progress reports stop", "request", r.id, "err", err)
		r.stopReports()
		return nil
	}
	r.e.log.Warn("request.progress failed; retrying with the next batch", "request", r.id, "err", err)
	return err
}

// stopReports ends the request's progress reports: what waits is dropped
// and Report keeps nothing more, so the reporter sleeps until the request
// ends rather than waking for tokens it will never send.
func (r *Request) stopReports() {
	r.mu.Lock()
	r.lost = true
	r.batch.discard()
	r.mu.Unlock()
}

func (e *Engine) onFenced(n *messages.FencedNotice) {
	e.mu.Lock()
	r := e.requests[n.RequestId]
	e.mu.Unlock()
	if r != nil && n.StaleEpoch >= r.epoch {
		r.cancel(fmt.Errorf("%w (moved to %s)", ErrFenced, n.NewOwner))
	}
}

// halt stops the reporter (waiting for a call in flight) and forgets the
// request; idempotent.
func (r *Request) halt() bool {
	r.mu.Lock()
	first := !r.ended
	r.ended = true
	r.mu.Unlock()
	if first {
		close(r.stop)
		<-r.done
		r.e.mu.Lock()
		if r.e.requests[r.id] == r {
			delete(r.e.requests, r.id)
		}
		r.e.mu.Unlock()
	}
	return first
}

// Finish ends the request (request.finish: the request actor releases the
// prefill hold), trying again while the member is unreachable, until ctx
// ends. Progress not yet reported is dropped. A fenced request
// returns an error wrapping ErrFenced and releases nothing.
func (r *Request) Finish(ctx context.Context) error {
	if !r.halt() {
		return nil
	}
	defer r.cancel(context.Canceled)
	if errors.Is(context.Cause(r.ctx), ErrFenced) {
		return fmt.Errorf("request %s: finish skipped: %w", r.id, context.Cause(r.ctx))
	}
	// A request left unfinished keeps its prefill hold alive (its actor
	// renews it) until request_ttl_s: while connexd or NATS is briefly
	// unreachable (a restart, a reconnect), try again until ctx ends.
	wait := 100 * time.Millisecond
	for {
		c, cancel := context.WithTimeout(ctx, r.e.cfg.CallTimeout)
		_, err := r.e.cli.FinishRequest(c, &messages.FinishRequestMsg{RequestId: r.id, Epoch: r.epoch})
		cancel()
		switch code := api.CodeOf(err); {
		case err == nil:
			return nil
		case code == api.CodeFenced:
			return fmt.Errorf("request %s: request.finish: %w (%v)", r.id, ErrFenced, err)
		case (code == api.CodePeerUnavailable || code == api.CodeTimeout) && ctx.Err() == nil:
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			wait = min(2*wait, time.Second)
			if ctx.Err() == nil {
				continue
			}
		}
		return fmt.Errorf("request %s: request.finish on member %s: %w", r.id, r.e.cfg.Member, err)
	}
}

// Abandon stops reporting without finishing: the request stays with its
// connexd (which keeps the hold alive) so that another engine can take it
// over. Used when the engine shuts down mid-stream.
func (r *Request) Abandon() {
	if r.halt() {
		r.cancel(context.Canceled)
	}
}
