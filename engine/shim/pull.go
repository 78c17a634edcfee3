package shim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// Load failure policies (kv_load_failure_policy).
const (
	PolicyFail      = "fail"      // fail the request with a clear error
	PolicyRecompute = "recompute" // prefill the missing KV locally
)

// LoadError is a failed KV load: the pull could not start or its PullDone
// reported an error. Policy says what the engine should do about it (from
// the PullDone's kv_load_failure_policy).
type LoadError struct {
	TransferID string
	Code       api.Code // api error code of the failure
	Reason     string   // Reason(Code): "expired", "released", "holder unavailable", …
	Policy     string   // PolicyFail or PolicyRecompute
	Detail     string   // the connexd's message
}

// Error says which transfer failed to load, why, and connexd's message.
func (e *LoadError) Error() string {
	return fmt.Sprintf("KV load of transfer %s failed: %s (%s)", e.TransferID, e.Reason, e.Detail)
}

// Reason names a load failure code the way a user reads it: its name, or
// the reason api/codes.json gives it (loadReasons: "holder unavailable"
// for peer_unavailable and engine_gone, …). The vLLM connector's
// connex_vllm.codes.reason says the same.
func Reason(c api.Code) string {
	if r, ok := loadReasons[c]; ok {
		return r
	}
	return c.Name()
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Policy is the kv_load_failure_policy of the last PullDone seen, or the
// configured default before any.
func (e *Engine) Policy() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lastPolicy != "" {
		return e.lastPolicy
	}
	return e.cfg.DefaultLoadFailurePolicy
}

// Pull reads the hold named by params into the engine's blocks dst (one
// per remote block, same order, where the block sizes are equal; else as
// many as kvmem.PullSize says the tokens need): pull.start, then the wait
// for its pull.done notice (the engine's notice subject is subscribed to
// before any pull starts). An engine with TPSize > 1 pulls into every
// rank's region at once, each rank its own heads, and the PullDone returned
// is rank 0's with the bytes of all. A failed load is a *LoadError (the
// first rank's that failed). Pull returns only once every rank's pull has
// ended (the notice came, or the pull's deadline passed), so dst may be
// reused afterwards even when ctx was canceled meanwhile.
func (e *Engine) Pull(ctx context.Context, params *messages.KVTransferParams, dst []uint32) (*messages.PullDone, error) {
	n := e.cfg.Layout.TPSize
	if n == 1 {
		return e.pullRank(ctx, params, dst, 0)
	}
	type result struct {
		d   *messages.PullDone
		err error
	}
	res := make([]result, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := e.pullRank(ctx, params, dst, r)
			res[r] = result{d, err}
		}()
	}
	wg.Wait()
	for _, r := range res {
		if r.err != nil {
			return r.d, r.err
		}
	}
	d := res[0].d
	for _, r := range res[1:] {
		d.Bytes += r.d.Bytes
	}
	return d, nil
}

// pullRank is Pull into the region of TP rank rank.
func (e *Engine) pullRank(ctx context.Context, params *messages.KVTransferParams, dst []uint32, rank uint32) (*messages.PullDone, error) {
	id := newID()
	ch := make(chan *messages.PullDone, 1)
	e.mu.Lock()
	e.pulls[id] = ch
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.pulls, id)
		e.mu.Unlock()
	}()
	req := &messages.StartPullRequest{Params: params, EngineId: e.cfg.EngineID, RegionId: e.cfg.RankRegionID(rank), BlockIds: dst, PullId: id, TimeoutMs: uint32(e.cfg.PullTimeout.Milliseconds())}
	var err error
	// Sent again when the answer may have been lost with a NATS server
	// (connexd treats a pull.start of a running pull id as the same pull).
	for attempt := 1; ; attempt++ {
		c, cancel := context.WithTimeout(ctx, e.cfg.CallTimeout)
		_, err = e.cli.StartPull(c, req)
		cancel()
		if err == nil || attempt == 3 || ctx.Err() != nil || !(errors.Is(err, nats.ErrNoResponders) || api.CodeOf(err) == api.CodeTimeout) {
			break
		}
		e.log.Warn("pull.start not answered; sending it again", "pull", id, "attempt", attempt, "err", err)
	}
	if err != nil && refused(err) {
		code := api.CodeOf(err)
		if e.lostRegion(err) {
			return nil, fmt.Errorf("engine %s: pull.start of %s: %w (%v)", e.cfg.EngineID, params.GetTransferId(), ErrRegionLost, err)
		}
		return nil, &LoadError{TransferID: params.GetTransferId(), Code: code, Reason: Reason(code), Policy: e.Policy(), Detail: fmt.Sprintf("pull.start on member %s: %v", e.cfg.Member, err)}
	}
	// The pull writes dst until it ends: wait for its notice even if ctx
	// ends, bounded by the pull's own deadline. So too when pull.start's
	// answer never came (timeouts, ctx ended, the link down): connexd may
	// run the pull all the same, and dst must not be reused under it.
	t := time.NewTimer(e.cfg.PullTimeout + 2*time.Second)
	defer t.Stop()
	var d *messages.PullDone
	select {
	case d = <-ch:
	case <-t.C:
		if err != nil && ctx.Err() != nil {
			return nil, fmt.Errorf("engine %s: pull.start of %s: %w", e.cfg.EngineID, params.GetTransferId(), context.Cause(ctx))
		}
		detail := fmt.Sprintf("no pull.done for pull %s within %s", id, e.cfg.PullTimeout+2*time.Second)
		if err != nil {
			detail = fmt.Sprintf("pull.start on member %s not answered (%v), and %s", e.cfg.Member, err, detail)
		}
		return nil, &LoadError{TransferID: params.GetTransferId(), Code: api.CodeTimeout, Reason: "timeout", Policy: e.Policy(), Detail: detail}
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("engine %s: pull of %s: %w", e.cfg.EngineID, params.GetTransferId(), context.Cause(ctx))
	}
	if !d.Ok {
		code := api.Code(d.ErrorCode)
		pol := d.KvLoadFailurePolicy
		if pol == "" {
			pol = e.Policy()
		}
		return d, &LoadError{TransferID: params.GetTransferId(), Code: code, Reason: Reason(code), Policy: pol, Detail: d.Error}
	}
	return d, nil
}

// refused reports whether a pull.start that failed with err certainly
// started nothing: connexd answered it with an error, or no connexd
// received it. A timeout, an ended ctx or a NATS link that went down say
// nothing of whether it runs.
func refused(err error) bool {
	var ae *api.Error
	if !errors.As(err, &ae) {
		return false
	}
	if errors.Is(err, nats.ErrNoResponders) {
		return true
	}
	return ae.Code != api.CodeTimeout && !api.LinkDown(err)
}

func (e *Engine) onPullDone(d *messages.PullDone) {
	e.mu.Lock()
	if d.KvLoadFailurePolicy != "" {
		e.lastPolicy = d.KvLoadFailurePolicy
	}
	ch := e.pulls[d.PullId]
	e.mu.Unlock()
	if ch == nil {
		e.log.Debug("pull.done for a pull nobody waits for", "pull", d.PullId)
		return
	}
	select {
	case ch <- d:
	default:
	}
}
