package pull

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	waitpoll "github.com/connex/connex/harness/poll"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
	"github.com/nats-io/nats.go"
)

// TestPullDriveWiring runs StartPuller against a real NATS server on which
// the holder's member answers nothing (or on a connexd shutting down), and
// checks what only the wiring can get wrong: pullMachine's re-asks reach
// NATS, its stall deadline and the pull's context end the goroutine, the
// PullDone notice says why, and the destination blocks and the region
// reference come back.
func TestPullDriveWiring(t *testing.T) {
	nc := testNATS(t)
	be := idleBackend{} // never dialled: the descriptors never come
	for _, c := range []struct {
		name     string
		answer   bool // the holder's member listens but never answers
		shutdown bool // connexd stops while the descriptors travel
		want     api.Code
	}{
		{"no responders until the stall deadline", false, false, api.CodePeerUnavailable},
		{"asks unanswered until the stall deadline", true, false, api.CodeTimeout},
		{"shutdown while asking", true, true, api.CodeTransferFailed},
	} {
		t.Run(c.name, func(t *testing.T) {
			var asks atomic.Int64
			if c.answer {
				sub, err := nc.Subscribe(api.Subject("h1", api.EpPeerDescriptors), func(*nats.Msg) { asks.Add(1) })
				if err != nil {
					t.Fatal(err)
				}
				defer sub.Unsubscribe()
			}
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			dst := mapped(t, kvmem.Layout{Layers: 2, Planes: 2, Blocks: 8, BlockBytes: 16, BlockSize: 4, TPSize: 1})
			blocks := []uint32{1, 2}
			if err := dst.Blocks.BeginWrite(blocks); err != nil {
				t.Fatal(err)
			}
			var released atomic.Int64
			// What an engine reading the notice finds: it may start the
			// next pull into the same blocks at once.
			type notice struct {
				d        *messages.PullDone
				writing  uint32
				released int64
			}
			dones := make(chan notice, 1)
			notify := func(d *messages.PullDone) { dones <- notice{d, dst.Blocks.Counts().Writing, released.Load()} }
			deps := &PullDeps{Backend: be, NC: nc, Notify: notify, Log: slog.New(slog.DiscardHandler), Metrics: &actors.Metrics{}, Ctx: ctx}
			stall := 300 * time.Millisecond
			StartPuller(deps, &Pull{
				ID: "p1", Dst: dst, DstBlocks: blocks, Timeout: time.Minute, Stall: stall, ReleaseRegion: func() { released.Add(1) },
				Params: &messages.KVTransferParams{TransferId: "t1", RemoteCtrl: &messages.RemoteCtrl{Member: "h1", Backend: "tcp"}, RemoteBlockIds: []uint32{0, 1}, RetainS: 60},
			})
			if c.shutdown {
				waitpoll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
					if asks.Load() == 0 {
						return errors.New("no ask yet")
					}
					return nil
				})
				stop()
			}
			var got notice
			select {
			case got = <-dones:
			case <-time.After(10 * time.Second):
				t.Fatal("no PullDone within 10 s")
			}
			d := got.d
			if d.Ok || api.Code(d.ErrorCode) != c.want {
				t.Fatalf("PullDone ok=%v code %d (%s), want %d: %s", d.Ok, d.ErrorCode, api.Code(d.ErrorCode).Name(), c.want, d.Error)
			}
			if c.answer && !c.shutdown && asks.Load() < 2 {
				t.Fatalf("%d asks within the stall deadline: the re-ask alongside never went out", asks.Load())
			}
			if got.writing != 0 || got.released != 1 {
				t.Fatalf("at PullDone: %d blocks still written, region released %d times; want both back first", got.writing, got.released)
			}
		})
	}
}

// idleBackend is a transport.Backend that is never dialled: Connect fails.
type idleBackend struct{}

func (idleBackend) Name() string         { return "idle" }
func (idleBackend) Caps() transport.Caps { return transport.Caps{} }
func (idleBackend) Address() []byte      { return []byte("idle") }
func (idleBackend) Close() error         { return nil }
func (idleBackend) Register(mem []byte) (transport.Registration, error) {
	return nil, errors.New("idleBackend registers nothing")
}
func (idleBackend) Connect(context.Context, []byte) (transport.Endpoint, error) {
	return nil, transport.ErrUnavailable
}
