//go:build ucx && cgo

package ucx

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// TestCapsMatchBehaviour: in each read mode and transport list, every
// capability Caps claims works and every one it denies is not there: the
// type implements what each flag promises (CheckCaps), a backend claiming
// ExtentKeys registers extents under one key, one claiming Allocate
// allocates, one claiming ManyRegister/ManyDeregister registers and
// deregisters many at once, and GetProgress reports as Progress says
// (once, at the end, without it), and a reader's endpoint shows an
// allocation's memory in place as Views says. In checked mode a kept key is refused
// after Deregister; onesided mode hands out keys read without the holder.
// Strided's native reads: TestGetStrided counts them.
func TestCapsMatchBehaviour(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"checked/default", Config{}},
		{"checked/tcp", Config{TLS: "tcp"}},
		{"onesided/default", Config{Reads: ReadsOneSided}},
		{"onesided/shm", Config{Reads: ReadsOneSided, TLS: SafeDefaultTLS}},
		{"checked/shared-get", Config{SharedReads: SharedReadsGet}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, err := OpenConfig(transport.Options{}, c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			caps := h.Caps()
			t.Logf("tls %q: %+v", h.TLS(), caps)
			if err := transport.CheckCaps(h); err != nil {
				t.Fatal(err)
			}
			mem := randBytes(1<<16, 3)
			exts := []transport.Extent{{Off: 0, Len: 4096}, {Off: 8192, Len: 4096}}
			reg, err := h.RegisterExtents(mem, exts)
			if (err == nil) != caps.ExtentKeys {
				t.Fatalf("Caps.ExtentKeys %v, RegisterExtents: %v", caps.ExtentKeys, err)
			}
			if err == nil {
				reg.Deregister()
			}

			a, err := h.Allocate(1 << 16)
			if (err == nil) != caps.Allocate {
				t.Fatalf("Caps.Allocate %v, Allocate: %v", caps.Allocate, err)
			}
			if err == nil {
				viewsMatch(t, c.cfg, h, a, caps.Views)
				reg, err := h.RegisterExtents(a.Bytes(), exts)
				if (err == nil) != caps.OneKeyForExtents(true) {
					t.Fatalf("Caps.OneKeyForExtents(allocated) %v, RegisterExtents on an allocation: %v", caps.OneKeyForExtents(true), err)
				}
				if err == nil {
					reg.Deregister()
				}
				if err := a.Free(); err != nil {
					t.Fatal(err)
				}
			}

			regs, err := transport.RegisterEach(h, [][]byte{mem[:4096], mem[8192:12288]})
			if err != nil || len(regs) != 2 {
				t.Fatalf("RegisterEach (Caps.ManyRegister %v): %d registrations, %v", caps.ManyRegister, len(regs), err)
			}
			if err := transport.DeregisterEach(h, regs); err != nil {
				t.Fatalf("DeregisterEach (Caps.ManyDeregister %v): %v", caps.ManyDeregister, err)
			}

			mem = randBytes(2*DefaultChunkBytes, 4)
			reg, err = h.Register(mem)
			if err != nil {
				t.Fatal(err)
			}
			rk, err := parseKey(reg.RemoteKey())
			if err != nil {
				t.Fatal(err)
			}
			if oneSided := rk.kind == keyOneSided || rk.kind == keyRMA; oneSided != (h.Reads() == ReadsOneSided) {
				t.Fatalf("reads %q, Register handed out a key of kind %d", h.Reads(), rk.kind)
			}
			r, err := OpenConfig(transport.Options{}, c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			ep := connectT(t, r, h)
			// Two of UCX's chunks, so a backend reporting progress as
			// bytes land would call more than once.
			const n = 2 * DefaultChunkBytes
			op := []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: make([]byte, n)}}
			var calls, landed int
			if err := getProgressT(ep, 5*time.Second, op, func(m int) { calls++; landed += m }); err != nil {
				t.Fatal(err)
			}
			if landed != n || (caps.Progress && calls < 2) || (!caps.Progress && calls != 1) {
				t.Fatalf("Caps.Progress %v, GetProgress of %d bytes reported %d bytes in %d calls", caps.Progress, n, landed, calls)
			}
			if h.Reads() == ReadsOneSided {
				reg.Deregister()
				return
			}
			if err := reg.Deregister(); err != nil {
				t.Fatal(err)
			}
			if err := getT(ep, 5*time.Second, op); !errors.Is(err, transport.ErrNotRegistered) {
				t.Fatalf("checked reads, but a kept key read after Deregister: %v", err)
			}
		})
	}
}

func getProgressT(ep transport.Endpoint, d time.Duration, ops []transport.GetOp, progress func(int)) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return ep.GetProgress(ctx, ops, progress)
}

// viewsMatch checks Caps.Views on a reader opened with cfg: its endpoint
// to h views memory of h's allocation a in place where views is true,
// and does not handle the view where it is false.
func viewsMatch(t *testing.T, cfg Config, h *Backend, a transport.Allocation, views bool) {
	t.Helper()
	reg, err := h.Register(a.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Deregister()
	r, err := OpenConfig(transport.Options{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if views != r.Caps().Views {
		t.Fatalf("holder and reader of one config disagree on Caps.Views")
	}
	ep := connectT(t, r, h)
	v, ok := ep.(transport.Viewer)
	if !ok {
		if views {
			t.Fatal("Caps.Views, but the endpoint is no Viewer")
		}
		return
	}
	copy(a.Bytes(), randBytes(4096, 9))
	var got []byte
	handled, err := v.View(context.Background(), []transport.ViewRange{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Len: 4096}}, func(views [][]byte) error {
		got = bytes.Clone(views[0])
		return nil
	})
	if err != nil || handled != views {
		t.Fatalf("Caps.Views %v, View of an allocation: handled %v, %v", views, handled, err)
	}
	if views && !bytes.Equal(got, a.Bytes()[:4096]) {
		t.Fatal("the view differs from the allocation's bytes")
	}
}
