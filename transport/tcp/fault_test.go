package tcp

import (
	"bytes"
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// mapShrinkable maps a new file of n bytes read-write and shared (an
// engine's region file) and returns a func that shrinks the file to m bytes.
func mapShrinkable(t *testing.T, n int) ([]byte, func(m int64)) {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "region-*")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(n)); err != nil {
		t.Fatal(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(mem) })
	name := f.Name()
	return mem, func(m int64) {
		if err := os.Truncate(name, m); err != nil {
			t.Fatal(err)
		}
	}
}

func get(t *testing.T, ep transport.Endpoint, ops ...transport.GetOp) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return ep.Get(ctx, ops)
}

// TestShrunkSourceIsRefused: the holder touches a GET's source before
// sending it; a source whose file shrank is refused with ErrFault and the
// connection keeps serving other GETs.
func TestShrunkSourceIsRefused(t *testing.T) {
	server, client := openBackend(t, Config{}), openBackend(t, Config{})
	mem, shrink := mapShrinkable(t, 1<<20)
	copy(mem, randomBytes(1, len(mem)))
	want := append([]byte(nil), mem[:4096]...)
	reg := register(t, server, mem)
	ep := connect(t, client, server)
	shrink(4096)
	err := get(t, ep, transport.GetOp{RemoteKey: reg.RemoteKey(), RemoteAddr: 65536, Dst: make([]byte, 65536)})
	wantErr(t, err, transport.ErrFault)
	got := make([]byte, 4096)
	if err := get(t, ep, transport.GetOp{RemoteKey: reg.RemoteKey(), RemoteAddr: 0, Dst: got}); err != nil {
		t.Fatalf("get of the pages still backed, after the refusal: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("get of the pages still backed: wrong bytes")
	}
}

// TestShrunkDestinationFailsTheGet: a destination whose file shrank fails
// its GET with ErrFault (no SIGBUS), and the connection stays in step: the
// next GET into good memory gets the right bytes.
func TestShrunkDestinationFailsTheGet(t *testing.T) {
	server, client := openBackend(t, Config{}), openBackend(t, Config{})
	src := randomBytes(2, 1<<20)
	reg := register(t, server, src)
	ep := connect(t, client, server)
	// Small payloads go through the reader's buffer (a Go copy), large
	// ones straight from the socket (read(2): EFAULT).
	for _, n := range []int{2048, 512 << 10} {
		dst, shrink := mapShrinkable(t, 1<<20)
		shrink(0)
		err := get(t, ep, transport.GetOp{RemoteKey: reg.RemoteKey(), RemoteAddr: 4096, Dst: dst[8192 : 8192+n]})
		wantErr(t, err, transport.ErrFault)
		good := make([]byte, n)
		if err := get(t, ep, transport.GetOp{RemoteKey: reg.RemoteKey(), RemoteAddr: 4096, Dst: good}); err != nil {
			t.Fatalf("%d bytes: get after the fault: %v", n, err)
		}
		if !bytes.Equal(good, src[4096:4096+n]) {
			t.Fatalf("%d bytes: get after the fault: wrong bytes (the stream lost step)", n)
		}
	}
}
