package simengine

import (
	"context"

	"github.com/connex/connex/engine/shim"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
)

// KV is what the server needs from its engine shim; *shim.Engine provides
// it through ShimKV, tests fake it.
type KV interface {
	// Ranks are the engine's KV regions, by TP rank (one for TP 1).
	Ranks() []*kvmem.Region
	Alloc(ctx context.Context, n int) ([]uint32, error)
	Free(ids []uint32)
	Hold(ctx context.Context, blocks []uint32, numTokens uint32) (*messages.KVTransferParams, error)
	// Release hands back a hold this engine created (its client left
	// before the answer naming it was delivered).
	Release(ctx context.Context, transferID string) error
	Pull(ctx context.Context, params *messages.KVTransferParams, dst []uint32) (*messages.PullDone, error)
	StartRequest(ctx context.Context, s shim.RequestSpec) (Activation, error)
	Begin() (end func())
	Counts() (free, total uint32, holds int)
	// Policy is the kv_load_failure_policy to apply when a load failed
	// after a successful pull (corrupt bytes).
	Policy() string
}

// Activation is a decode request's activation (shim.Request).
type Activation interface {
	Report(toks ...uint32)
	Context() context.Context
	Finish(ctx context.Context) error
	Abandon()
}

// ShimKV adapts a *shim.Engine to KV.
type ShimKV struct{ *shim.Engine }

// StartRequest runs request.start through the shim.
func (k ShimKV) StartRequest(ctx context.Context, s shim.RequestSpec) (Activation, error) {
	r, err := k.Engine.StartRequest(ctx, s)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Counts reports the allocator's free and total blocks and live holds.
func (k ShimKV) Counts() (free, total uint32, holds int) { return k.Engine.BlockCounts() }
