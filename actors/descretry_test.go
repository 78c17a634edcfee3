package actors

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// stepAsks asks as a NATS request travels: each post runs step on a
// goroutine of its own (with ctx, the test's), whose result arrives on the
// answers channel.
func stepAsks(ctx context.Context, step func(context.Context) (*messages.Descriptors, error)) descAsks[stepAnswer] {
	ch := make(chan stepAnswer, 16)
	return descAsks[stepAnswer]{
		post: func() error {
			go func() {
				d, err := step(ctx)
				select {
				case ch <- stepAnswer{d, err}:
				case <-ctx.Done():
				}
			}()
			return nil
		},
		answers: ch,
		decode:  func(a stepAnswer) (*messages.Descriptors, error) { return a.d, a.err },
	}
}

type stepAnswer struct {
	d   *messages.Descriptors
	err error
}

func TestDescriptorsRetrying(t *testing.T) {
	noResponders := &api.Error{Code: api.CodePeerUnavailable, Msg: "peer.descriptors: no responders", Cause: nats.ErrNoResponders}
	want := &messages.Descriptors{TransferId: "t"}
	for _, tc := range []struct {
		name  string
		steps []func(ctx context.Context) (*messages.Descriptors, error)
		calls int
		ok    bool
	}{
		{"answered at once", []func(context.Context) (*messages.Descriptors, error){
			func(context.Context) (*messages.Descriptors, error) { return want, nil },
		}, 1, true},
		{"holder between NATS servers, then back", []func(context.Context) (*messages.Descriptors, error){
			func(context.Context) (*messages.Descriptors, error) { return nil, noResponders },
			func(context.Context) (*messages.Descriptors, error) { return nil, noResponders },
			func(context.Context) (*messages.Descriptors, error) { return want, nil },
		}, 3, true},
		{"first request lost with its server", []func(context.Context) (*messages.Descriptors, error){
			func(ctx context.Context) (*messages.Descriptors, error) {
				<-ctx.Done()
				return nil, api.Errorf(api.CodeTimeout, "peer.descriptors: %v", ctx.Err())
			},
			func(context.Context) (*messages.Descriptors, error) { return want, nil },
		}, 2, true},
		{"a slow holder: the first ask is answered after a second was sent", []func(context.Context) (*messages.Descriptors, error){
			func(context.Context) (*messages.Descriptors, error) {
				<-time.After(150 * time.Millisecond) // longer than a third of the stall
				return want, nil
			},
			func(ctx context.Context) (*messages.Descriptors, error) {
				<-ctx.Done() // this one's answer never comes
				return nil, api.Errorf(api.CodeTimeout, "peer.descriptors: %v", ctx.Err())
			},
		}, 2, true},
		{"the holder's answer is final", []func(context.Context) (*messages.Descriptors, error){
			func(context.Context) (*messages.Descriptors, error) {
				return nil, api.Errorf(api.CodeExpired, "gone")
			},
		}, 1, false},
		{"a timeout the holder answered is final", []func(context.Context) (*messages.Descriptors, error){
			func(context.Context) (*messages.Descriptors, error) {
				return nil, api.Errorf(api.CodeTimeout, "the holder said so")
			},
		}, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var mu sync.Mutex
			calls := 0
			d, err := descriptorsRetrying(ctx, clock.Real{}, 300*time.Millisecond, stepAsks(ctx, func(c context.Context) (*messages.Descriptors, error) {
				mu.Lock()
				f := tc.steps[min(calls, len(tc.steps)-1)]
				calls++
				mu.Unlock()
				return f(c)
			}), false)
			mu.Lock()
			defer mu.Unlock()
			if calls != tc.calls || (err == nil) != tc.ok || (tc.ok && d != want) {
				t.Fatalf("calls %d (want %d), descriptors %v, err %v", calls, tc.calls, d, err)
			}
		})
	}
	// The stall deadline ends the retries.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := descriptorsRetrying(ctx, clock.Real{}, time.Second, stepAsks(ctx, func(context.Context) (*messages.Descriptors, error) { return nil, noResponders }), false)
	if !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("after the deadline: %v", err)
	}
}

// TestDescriptorsRetryingCanceled: a pull canceled while its descriptors
// travel (connexd stopping) ends canceled, never as a timeout, whichever
// of the outstanding ask and the cancellation is seen first (found by
// e2e's TestReaderShutdownDuringPull: 504 instead of transfer_failed).
func TestDescriptorsRetryingCanceled(t *testing.T) {
	for i := range 50 {
		ctx, cancel := context.WithCancel(context.Background())
		asked := make(chan struct{})
		go func() { <-asked; cancel() }()
		_, err := descriptorsRetrying(ctx, clock.Real{}, time.Second, stepAsks(ctx, func(c context.Context) (*messages.Descriptors, error) {
			close(asked)
			<-c.Done()
			return nil, c.Err()
		}), false)
		if !errors.Is(err, context.Canceled) || api.CodeOf(err) == api.CodeTimeout {
			t.Fatalf("run %d: canceled ask ended with %v (code %d), want context.Canceled", i, err, api.CodeOf(err))
		}
	}
}

// TestDescriptorsRetryingOnTheClock drives the re-asks with a clock.Fake:
// an ask unanswered for a third of the stall gets a second one alongside,
// not a moment before; "no responders" is asked again 25ms later.
func TestDescriptorsRetryingOnTheClock(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewFake(t0)
	noResponders := &api.Error{Code: api.CodePeerUnavailable, Msg: "peer.descriptors: no responders", Cause: nats.ErrNoResponders}
	want := &messages.Descriptors{TransferId: "t"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	calls := 0
	count := func() int { mu.Lock(); defer mu.Unlock(); return calls }
	type result struct {
		d   *messages.Descriptors
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := descriptorsRetrying(ctx, clk, 3*time.Second, stepAsks(ctx, func(c context.Context) (*messages.Descriptors, error) {
			mu.Lock()
			calls++
			n := calls
			mu.Unlock()
			switch n {
			case 1: // lost with its server: never answered
				<-c.Done()
				return nil, c.Err()
			case 2:
				return nil, noResponders
			}
			return want, nil
		}), false)
		done <- result{d, err}
	}()
	poll(t, "first ask, and the timer for the next", func() error {
		if count() != 1 || clk.Pending() != 1 {
			return fmt.Errorf("%d asks, %d timers", count(), clk.Pending())
		}
		return nil
	})
	clk.Advance(999 * time.Millisecond)
	if n := count(); n != 1 {
		t.Fatalf("%d asks before a third of the stall", n)
	}
	clk.Advance(time.Millisecond)
	poll(t, "the second ask, answered no responders, paced 25ms", func() error {
		if at, ok := clk.NextDue(); count() != 2 || !ok || at.Sub(t0) != time.Second+25*time.Millisecond {
			return fmt.Errorf("%d asks, next due %v", count(), at.Sub(t0))
		}
		return nil
	})
	clk.Advance(25 * time.Millisecond)
	r := <-done
	if r.err != nil || r.d != want || count() != 3 {
		t.Fatalf("%d asks, descriptors %v, err %v", count(), r.d, r.err)
	}
}
