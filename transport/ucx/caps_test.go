//go:build ucx && cgo

package ucx

import (
	"errors"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// TestCapsMatchBehaviour: in each read mode and transport list, every
// capability Caps claims works and every one it denies is not there: a
// backend claiming ExtentKeys registers extents under one key, one
// claiming Allocate allocates, one claiming Revocable refuses a kept key
// after Deregister, OneSided backends hand out keys read without the
// holder.
func TestCapsMatchBehaviour(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
	}{
		{"checked/default", Config{}},
		{"checked/tcp", Config{TLS: "tcp"}},
		{"onesided/default", Config{Reads: ReadsOneSided}},
		{"onesided/shm", Config{Reads: ReadsOneSided, TLS: SafeDefaultTLS}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, err := OpenConfig(transport.Options{}, c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			caps := h.Caps()
			t.Logf("tls %q: %+v", h.TLS(), caps)
			if _, ok := any(&Endpoint{}).(transport.ProgressEndpoint); ok != caps.Progress {
				t.Fatalf("Caps.Progress %v, endpoints a ProgressEndpoint: %v", caps.Progress, ok)
			}
			if _, ok := any(&Endpoint{}).(transport.StridedEndpoint); ok != caps.Strided {
				t.Fatalf("Caps.Strided %v, endpoints a StridedEndpoint: %v", caps.Strided, ok)
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

			reg, err = h.Register(mem)
			if err != nil {
				t.Fatal(err)
			}
			rk, err := parseKey(reg.RemoteKey())
			if err != nil {
				t.Fatal(err)
			}
			if oneSided := rk.kind == keyOneSided || rk.kind == keyRMA; oneSided != caps.OneSided {
				t.Fatalf("Caps.OneSided %v, Register handed out a key of kind %d", caps.OneSided, rk.kind)
			}
			if !caps.Revocable {
				reg.Deregister()
				return
			}
			r, err := OpenConfig(transport.Options{}, c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			ep := connectT(t, r, h)
			op := []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: make([]byte, 4096)}}
			if err := getT(ep, 5*time.Second, op); err != nil {
				t.Fatal(err)
			}
			if err := reg.Deregister(); err != nil {
				t.Fatal(err)
			}
			if err := getT(ep, 5*time.Second, op); !errors.Is(err, transport.ErrNotRegistered) {
				t.Fatalf("Caps.Revocable, but a kept key read after Deregister: %v", err)
			}
		})
	}
}
