package pull

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/errcode"
	"github.com/connex/connex/transport"
)

// progressEndpoint is an endpoint of a backend with Caps.Progress whose
// GetProgress the test steers:
// each value on steps is reported as landed bytes (acknowledged on acks);
// a closed steps ends the Get successfully. With steps nil it reports
// nothing and ends with its context.
type progressEndpoint struct {
	steps chan int
	acks  chan struct{}
}

func (e *progressEndpoint) Get(ctx context.Context, ops []transport.GetOp) error {
	return e.GetProgress(ctx, ops, nil)
}

func (e *progressEndpoint) GetProgress(ctx context.Context, _ []transport.GetOp, progress func(int)) error {
	for {
		if err := ctx.Err(); err != nil {
			return transport.CtxErr(err)
		}
		select {
		case n, ok := <-e.steps:
			if !ok {
				return nil
			}
			progress(n)
			e.acks <- struct{}{}
		case <-ctx.Done():
			return transport.CtxErr(ctx.Err())
		}
	}
}

func (e *progressEndpoint) GetStrided(ctx context.Context, ops []transport.StridedOp) error {
	return e.Get(ctx, transport.Pieces(ops))
}

func (e *progressEndpoint) GetStridedProgress(ctx context.Context, ops []transport.StridedOp, progress func(int)) error {
	return transport.StridedProgressAtEnd(ctx, ops, progress, e.GetStrided)
}

func (e *progressEndpoint) Close() error { return nil }

// readOnClock runs readBatches of one batch against ep with the stall
// deadline on clk, and returns its result's channel.
func readOnClock(clk clock.Clock, stall time.Duration, ep transport.Endpoint) <-chan error {
	a := &puller{deps: &PullDeps{Clock: clk}, p: &Pull{ID: "p1", Stall: stall}}
	ops, total := testOps(8)
	errc := make(chan error, 1)
	go func() {
		errc <- a.readBatches(context.Background(), ep, transport.Caps{Progress: true}, ops, total, "h1")
	}()
	return errc
}

// TestStallWatchSlowButSteady: a read whose bytes keep landing, half a stall
// deadline apart, completes although it takes five deadlines in all.
func TestStallWatchSlowButSteady(t *testing.T) {
	const stall = time.Second
	clk := clock.NewFake(time.Unix(1000, 0))
	ep := &progressEndpoint{steps: make(chan int), acks: make(chan struct{})}
	errc := readOnClock(clk, stall, ep)
	for i := range 10 {
		select {
		case ep.steps <- 1:
		case err := <-errc:
			t.Fatalf("read ended after %d half-deadlines of steady progress: %v", i, err)
		}
		<-ep.acks
		clk.Advance(stall / 2)
	}
	close(ep.steps)
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("a read that kept landing bytes failed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("read still running 10 s after its endpoint returned")
	}
}

// TestStallWatchNoProgress: a read that lands nothing fails once the stall
// deadline has passed on the clock, with timeout and the bytes it got.
func TestStallWatchNoProgress(t *testing.T) {
	const stall = time.Second
	clk := clock.NewFake(time.Unix(1000, 0))
	ep := &progressEndpoint{steps: make(chan int), acks: make(chan struct{})}
	errc := readOnClock(clk, stall, ep)
	ep.steps <- 3
	<-ep.acks
	clk.Advance(stall / 2)
	select {
	case err := <-errc:
		t.Fatalf("read ended half a stall deadline after its last progress: %v", err)
	default:
	}
	clk.Advance(stall / 2) // the watch's timer cancels the read inside Advance
	select {
	case err := <-errc:
		if !errors.Is(err, transport.ErrTimeout) || errcode.Of(err) != api.CodeTimeout ||
			!strings.Contains(err.Error(), "made no progress for 1s after 3 of 8 bytes") {
			t.Fatalf("code %d: %v", errcode.Of(err), err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("read without progress still running 10 s after the stall deadline passed on the clock")
	}
}
