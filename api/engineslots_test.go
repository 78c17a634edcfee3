package api

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/messages"
)

// slowHolds is a Handler whose hold.create waits until released.
type slowHolds struct {
	Handler
	started chan string
	release chan struct{}
}

func (h *slowHolds) CreateHold(ctx context.Context, r *messages.CreateHoldRequest) (*messages.CreateHoldReply, error) {
	h.started <- r.GetEngineId()
	select {
	case <-h.release:
	case <-ctx.Done():
	}
	return &messages.CreateHoldReply{}, nil
}

// TestEngineShareOfInFlight (issue 44): against a real NATS server, an
// engine with MaxInFlightPerEngine calls in flight gets CodeOverloaded
// naming its share, while another engine's call and a member's call on the
// same service are served; its share comes back when its calls end.
// Before, one engine could take every one of the member's slots.
func TestEngineShareOfInFlight(t *testing.T) {
	nc, cli := startServer(t)
	h := &slowHolds{started: make(chan string, 16), release: make(chan struct{})}
	svc, err := Serve(nc, h, ServeOptions{Member: "m1", Version: "0.0.1", MaxRequestBytes: 1 << 20, MaxInFlight: 8, MaxInFlightPerEngine: 2,
		Timeout: 10 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	call := func(engine string) error {
		c := &Client{NC: cli, Member: "m1", Engine: engine}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return c.Call(ctx, EpHoldCreate, &messages.CreateHoldRequest{EngineId: engine}, &messages.CreateHoldReply{})
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 2 {
		wg.Go(func() { errs <- call("engA") })
	}
	for range 2 {
		if got := <-h.started; got != "engA" {
			t.Fatalf("started a call of %q, want engA", got)
		}
	}
	if err := call("engA"); CodeOf(err) != CodeOverloaded {
		t.Fatalf("engA's third call in flight: %v, want overloaded", err)
	}
	wg.Go(func() { errs <- call("engB") })
	wg.Go(func() { errs <- call("") }) // a member's call
	for range 2 {
		select {
		case <-h.started:
		case <-time.After(10 * time.Second):
			t.Fatal("another engine's or a member's call was not served while engA was at its share")
		}
	}
	close(h.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Its share is back (release stays closed: calls end at once).
	for i := range 3 {
		go func() { <-h.started }()
		if err := call("engA"); err != nil {
			t.Fatal(fmt.Errorf("engA's call %d after its calls ended: %w", i, err))
		}
	}
}
