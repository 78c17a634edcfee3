package daemon

import (
	"context"
	"errors"
	"testing"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests/activation"
)

// fakeHoldCaller is holdCaller: a hold bound to consumer for request, and
// the messages it got.
type fakeHoldCaller struct {
	consumer, request string
	got               []any
}

func (f *fakeHoldCaller) askHold(_ string, msg any) (actors.Reply, error) {
	f.got = append(f.got, msg)
	return actors.Reply{Consumer: f.consumer, Request: f.request}, nil
}

// fakeStore is requestStore: one stored state (or an error), and the
// number of reads.
type fakeStore struct {
	st    *messages.RequestState
	err   error
	reads int
}

func (s *fakeStore) Get(context.Context, string) (*messages.RequestState, uint64, error) {
	s.reads++
	return s.st, 1, s.err
}

func (s *fakeStore) Head(ctx context.Context, id string) (*messages.RequestState, uint64, error) {
	return s.Get(ctx, id)
}

func storedState(engine, transfer string, epoch uint64) *messages.RequestState {
	return &messages.RequestState{EngineId: engine, Epoch: epoch, Params: &messages.KVTransferParams{TransferId: transfer}}
}

func TestRebindAfterARefusedCall(t *testing.T) {
	call := activation.BindCall{Transfer: tid1, Requester: "d2", Request: "req1"}
	for _, c := range []struct {
		name      string
		consumer  string // the hold's binding now
		request   string
		store     *fakeStore
		wantRead  bool
		wantEpoch uint64 // 0: no rebind
	}{
		{"unbound hold, the state names the caller", "", "", &fakeStore{st: storedState("d2", tid1, 3)}, true, 3},
		{"moved by a resume: bound to the old engine", "d1", "req1", &fakeStore{st: storedState("d2", tid1, 4)}, true, 4},
		{"the state names another engine", "d1", "req1", &fakeStore{st: storedState("d1", tid1, 4)}, true, 0},
		{"the state names another transfer", "", "", &fakeStore{st: storedState("d2", tid2, 4)}, true, 0},
		{"the store does not answer", "", "", &fakeStore{err: errors.New("timeout")}, true, 0},
		{"bound to the caller already", "d2", "req1", &fakeStore{st: storedState("d2", tid1, 5)}, false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &fakeHoldCaller{consumer: c.consumer, request: c.request}
			(&requestBinder{holds: h, store: c.store, log: quiet}).bind(call)
			if (c.store.reads > 0) != c.wantRead {
				t.Fatalf("store read %d times, want read: %v", c.store.reads, c.wantRead)
			}
			var rebinds []*actors.RebindHold
			for _, m := range h.got {
				if r, ok := m.(*actors.RebindHold); ok {
					rebinds = append(rebinds, r)
				}
			}
			if c.wantEpoch == 0 {
				if len(rebinds) != 0 {
					t.Fatalf("rebound: %+v; want the hold left as it is", rebinds[0])
				}
				return
			}
			want := actors.RebindHold{Consumer: "d2", Request: "req1", Epoch: c.wantEpoch}
			if len(rebinds) != 1 || *rebinds[0] != want {
				t.Fatalf("rebinds %+v, want one %+v", rebinds, want)
			}
		})
	}
}
