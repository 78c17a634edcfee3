package tcp

import (
	"context"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// TestCapsMatchBehaviour: what Caps claims the TCP backend does, it does:
// one key for many extents, Deregister cuts a kept key, no allocation.
func TestCapsMatchBehaviour(t *testing.T) {
	server := openBackend(t, Config{})
	client := openBackend(t, Config{})
	caps := server.Caps()
	if !caps.ExtentKeys || !caps.OneKeyForExtents(false) || caps.OneSided || caps.Allocate || !caps.Revocable || !caps.Progress || caps.MaxInFlight != DefaultConfig().WindowOps {
		t.Fatalf("Caps = %+v", caps)
	}
	mem := randomBytes(3, 1<<16)
	reg, err := server.RegisterExtents(mem, []transport.Extent{{Off: 0, Len: 4096}, {Off: 8192, Len: 4096}})
	if err != nil {
		t.Fatalf("Caps.ExtentKeys, but RegisterExtents: %v", err)
	}
	if _, ok := transport.Backend(server).(transport.Allocator); ok {
		t.Fatal("Caps.Allocate is false, but the backend implements Allocator")
	}
	ep := connect(t, client, server)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	op := []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + 8192, Dst: make([]byte, 4096)}}
	if err := ep.Get(ctx, op); err != nil {
		t.Fatal(err)
	}
	if _, ok := ep.(transport.StridedEndpoint); ok || caps.Strided {
		t.Fatalf("Caps.Strided %v, endpoint a StridedEndpoint %v: TCP reads strided ops' pieces as GetOps", caps.Strided, ok)
	}
	pe, ok := ep.(transport.ProgressEndpoint)
	if !ok {
		t.Fatal("Caps.Progress, but the endpoint is not a ProgressEndpoint")
	}
	var landed, calls int
	if err := pe.GetProgress(ctx, op, func(n int) { landed += n; calls++ }); err != nil || landed != 4096 || calls != 1 {
		t.Fatalf("GetProgress of 4096 bytes: err %v, progress %d bytes in %d calls", err, landed, calls)
	}
	if err := reg.Deregister(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, ep.Get(ctx, op), transport.ErrNotRegistered)
}
