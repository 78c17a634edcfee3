//go:build ucx && cgo

package ucx

import (
	"bytes"
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// viewT views ranges through ep and returns copies of the views, whether
// the view was handled, and its error.
func viewT(t *testing.T, ctx context.Context, ep transport.Endpoint, ranges []transport.ViewRange) ([][]byte, bool, error) {
	t.Helper()
	v, ok := ep.(transport.Viewer)
	if !ok {
		t.Fatal("a UCX endpoint is not a transport.Viewer")
	}
	var got [][]byte
	handled, err := v.View(ctx, ranges, func(views [][]byte) error {
		for _, b := range views {
			got = append(got, bytes.Clone(b))
		}
		return nil
	})
	return got, handled, err
}

// TestViewSharedKeys: a holder's shared allocation on this host is shown
// in place: every range's bytes, an empty range as nothing, with the
// holder's progress loop stalled (one-sided, as a mapped Get); the views
// do not outlive fn; fn's error is the View's; ranges outside the
// registered memory are refused before fn (a shared key's reader maps the
// memory whole: extents restrict only checked reads). Where the reader reads shared
// keys with GETs, the key is not a shared key, or the reader cannot map
// the holder's segment, View does not handle the ranges.
func TestViewSharedKeys(t *testing.T) {
	h, r := openT(t, ""), openShared(t, SharedReadsMap)
	const n = 8 << 20
	a := allocT(t, h, n)
	src := randBytes(n, 6)
	copy(a.Bytes(), src)
	reg, err := h.RegisterExtents(a.Bytes(), []transport.Extent{{Off: 1 << 20, Len: 1 << 20}, {Off: 4 << 20, Len: 2 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Deregister()
	ep := connectT(t, r, h)
	key, base := reg.RemoteKey(), reg.RemoteAddr()
	ranges := []transport.ViewRange{
		{RemoteKey: key, RemoteAddr: base + 4<<20 + 100, Len: 1<<20 + 7},
		{RemoteKey: key, RemoteAddr: base + 1<<20, Len: 32},
		{RemoteKey: key, RemoteAddr: base + 1<<20 + 16, Len: 64}, // overlaps the one before
		{RemoteKey: key, RemoteAddr: base + 4<<20, Len: 0},
		{RemoteKey: key, RemoteAddr: base + 6<<20 - 4096, Len: 4096},
	}
	check := func(label string) {
		t.Helper()
		got, handled, err := viewT(t, context.Background(), ep, ranges)
		if err != nil || !handled {
			t.Fatalf("%s: handled %v, %v", label, handled, err)
		}
		for i, rg := range ranges {
			off := rg.RemoteAddr - base
			if !bytes.Equal(got[i], src[off:off+rg.Len]) {
				t.Fatalf("%s: view %d differs from the holder's bytes", label, i)
			}
		}
	}
	check("view")
	resume := pauseHolder(t, h)
	check("view with the holder stalled")
	resume()

	v := ep.(transport.Viewer)
	var kept [][]byte
	boom := errors.New("regroup failed")
	if handled, err := v.View(context.Background(), ranges, func(views [][]byte) error { kept = views; return boom }); !handled || !errors.Is(err, boom) {
		t.Fatalf("fn's error: handled %v, %v", handled, err)
	}
	for i, b := range kept {
		if b != nil {
			t.Fatalf("view %d is still set after View returned", i)
		}
	}
	called := false
	for _, out := range []transport.ViewRange{{RemoteKey: key, RemoteAddr: base + n - 16, Len: 32}, {RemoteKey: key, RemoteAddr: base - 4096, Len: 4096}} {
		if _, err := v.View(context.Background(), append(ranges[:1:1], out), func([][]byte) error { called = true; return nil }); !errors.Is(err, transport.ErrNotRegistered) || called {
			t.Fatalf("a range [%#x, +%d) outside the registration: %v (fn called: %v), want ErrNotRegistered", out.RemoteAddr, out.Len, err, called)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := v.View(ctx, ranges, func([][]byte) error { called = true; return nil }); !errors.Is(err, transport.ErrCanceled) || called {
		t.Fatalf("a canceled View: %v (fn called: %v), want ErrCanceled", err, called)
	}

	// Not handled: shared keys read with GETs, a key that is not shared,
	// a reader that cannot map the holder's segment.
	if _, handled, err := viewT(t, context.Background(), connectT(t, openShared(t, SharedReadsGet), h), ranges); handled || err != nil {
		t.Fatalf("shared_reads=get: handled %v, %v; want not handled", handled, err)
	}
	plain := randBytes(1<<20, 7)
	preg, err := h.Register(plain)
	if err != nil {
		t.Fatal(err)
	}
	defer preg.Deregister()
	if _, handled, err := viewT(t, context.Background(), ep, []transport.ViewRange{{RemoteKey: preg.RemoteKey(), RemoteAddr: preg.RemoteAddr(), Len: 4096}}); handled || err != nil {
		t.Fatalf("a registration of Go memory: handled %v, %v; want not handled", handled, err)
	}
	hp, rt := openT(t, "posix,tcp,self"), openT(t, "tcp,self")
	pa := allocT(t, hp, 1<<20)
	preg2, err := hp.Register(pa.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	defer preg2.Deregister()
	if _, handled, err := viewT(t, context.Background(), connectT(t, rt, hp), []transport.ViewRange{{RemoteKey: preg2.RemoteKey(), RemoteAddr: preg2.RemoteAddr(), Len: 4096}}); handled || err != nil {
		t.Fatalf("a reader without shared memory: handled %v, %v; want not handled", handled, err)
	}
}

// TestViewSharedHolderProcessKilled: a view of a holder process's shared
// allocation shows its bytes; once the holder is SIGKILLed, a View fails
// with ErrPeerGone (checked after fn: the memory is still mapped here,
// but the hold died with its holder).
func TestViewSharedHolderProcessKilled(t *testing.T) {
	h := startHolderReads(t, "", "shared")
	r := openShared(t, SharedReadsMap)
	ep, _ := connectHolder(t, r, h)
	want := randBytes(holderSize, holderSeed)
	ranges := []transport.ViewRange{{RemoteKey: h.key, RemoteAddr: h.base + 4096, Len: holderSize - 8192}, {RemoteKey: h.key, RemoteAddr: h.base, Len: 32}}
	got, handled, err := viewT(t, context.Background(), ep, ranges)
	if err != nil || !handled {
		t.Fatalf("view of the holder process: handled %v, %v", handled, err)
	}
	if !bytes.Equal(got[0], want[4096:holderSize-4096]) || !bytes.Equal(got[1], want[:32]) {
		t.Fatal("views of the holder process differ from its bytes")
	}
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 2*time.Second, time.Millisecond, func() error {
		_, handled, err := viewT(t, context.Background(), ep, ranges)
		switch {
		case err == nil:
			return errors.New("views of the killed holder still succeed")
		case !handled || !errors.Is(err, transport.ErrPeerGone):
			t.Fatalf("view of the killed holder: handled %v, %v; want ErrPeerGone", handled, err)
		}
		return nil
	})
}
