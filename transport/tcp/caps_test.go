package tcp

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// TestCapsMatchBehaviour: what Caps claims the TCP backend does, it does,
// and what it denies it lacks: one key for many extents, progress reported
// chunk by chunk, a Get of any size, strided ops read (scatter_test.go
// checks their requests), counters (gather_test.go checks them), no
// allocation, no many-at-once registration, no fault guard, no views; and
// Deregister cuts a kept key.
func TestCapsMatchBehaviour(t *testing.T) {
	server := openBackend(t, Config{})
	client := openBackend(t, Config{})
	caps := server.Caps()
	if !caps.ExtentKeys || !caps.OneKeyForExtents(false) || caps.Allocate || !caps.Progress || !caps.Strided || !caps.Counters ||
		caps.ManyRegister || caps.ManyDeregister || caps.GuardFaults || caps.Views || caps.MaxGetBytes != 0 {
		t.Fatalf("Caps = %+v", caps)
	}
	if err := transport.CheckCaps(server); err != nil {
		t.Fatal(err)
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
	if _, ok := ep.(transport.Viewer); ok {
		t.Fatal("Caps.Views is false, but the endpoint implements Viewer")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	op := []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + 8192, Dst: make([]byte, 4096)}}
	if err := ep.Get(ctx, op); err != nil {
		t.Fatal(err)
	}
	var landed, calls int
	if err := ep.GetProgress(ctx, op, func(n int) { landed += n; calls++ }); err != nil || landed != 4096 || calls != 1 {
		t.Fatalf("GetProgress of 4096 bytes: err %v, progress %d bytes in %d calls", err, landed, calls)
	}
	// Caps.Progress: a Get of several chunks reports each as it lands;
	// MaxGetBytes 0: one op of many chunks is read whole.
	big := randomBytes(4, 3*DefaultConfig().ChunkBytes)
	bigReg, err := server.Register(big)
	if err != nil {
		t.Fatal(err)
	}
	defer bigReg.Deregister()
	dst := make([]byte, len(big))
	landed, calls = 0, 0
	if err := ep.GetProgress(ctx, []transport.GetOp{{RemoteKey: bigReg.RemoteKey(), RemoteAddr: bigReg.RemoteAddr(), Dst: dst}}, func(n int) { landed += n; calls++ }); err != nil {
		t.Fatal(err)
	}
	if landed != len(big) || calls < 3 || !bytes.Equal(dst, big) {
		t.Fatalf("Caps.Progress, but GetProgress of %d bytes (3 chunks) reported %d bytes in %d calls (equal %v)", len(big), landed, calls, bytes.Equal(dst, big))
	}
	// Strided: GetStrided reads a strided op.
	sdst := make([]byte, 2*1024)
	if err := ep.GetStrided(ctx, []transport.StridedOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + 8192, RemoteStride: 2048, Dst: sdst, DstStride: 1024, Len: 1024, Count: 2}}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(sdst[:1024], mem[8192:9216]) || !bytes.Equal(sdst[1024:], mem[10240:11264]) {
		t.Fatal("GetStrided read the wrong bytes")
	}
	if err := reg.Deregister(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, ep.Get(ctx, op), transport.ErrNotRegistered)
}
