package actors

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/transport"
)

// extentBackend is a transport.Backend that claims caps and records every
// registration it makes; it fails the registration numbered failAt (from
// 1), if set.
type extentBackend struct {
	caps    transport.Caps
	failAt  int
	made    int
	regs    []*extentReg
	extents [][]transport.Extent // RegisterExtents calls
}

type extentReg struct {
	addr uint64
	n    int
	dead bool
}

func (r *extentReg) RemoteKey() []byte  { return []byte{byte(r.addr)} }
func (r *extentReg) RemoteAddr() uint64 { return r.addr }
func (r *extentReg) Len() int           { return r.n }
func (r *extentReg) Deregister() error  { r.dead = true; return nil }

func (b *extentBackend) Name() string         { return "fake" }
func (b *extentBackend) Caps() transport.Caps { return b.caps }
func (b *extentBackend) Address() []byte      { return nil }
func (b *extentBackend) Close() error         { return nil }
func (b *extentBackend) Connect(context.Context, []byte) (transport.Endpoint, error) {
	return nil, transport.ErrUnavailable
}

func (b *extentBackend) reg(n int) (transport.Registration, error) {
	b.made++
	if b.made == b.failAt {
		return nil, errors.New("injected")
	}
	r := &extentReg{addr: uint64(1000 * b.made), n: n}
	b.regs = append(b.regs, r)
	return r, nil
}

func (b *extentBackend) Register(mem []byte) (transport.Registration, error) { return b.reg(len(mem)) }

func (b *extentBackend) RegisterExtents(mem []byte, exts []transport.Extent) (transport.Registration, error) {
	b.extents = append(b.extents, exts)
	return b.reg(len(mem))
}

// TestRegisterHold: the strategy follows the backend's Caps: one key over
// every extent of the hold (sorted by offset, descriptors implied) where
// Caps.OneKeyForExtents holds for the region's memory, else one
// registration per extent with a segment each; a failure leaves nothing
// registered.
func TestRegisterHold(t *testing.T) {
	l := kvmem.Layout{Layers: 2, Planes: 2, Blocks: 8, BlockBytes: 64, BlockSize: 4, TPSize: 1}
	region := func(memory string) *kvmem.Region {
		r, err := kvmem.NewRegion("/nowhere", l, memory, make([]byte, l.Size()), func() error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	blocks := []uint32{5, 1, 2, 6} // runs 1-2 and 5-6, in the hold's order 5-6 first
	exts := l.Extents(blocks)

	oneKey := func(t *testing.T, b *extentBackend, hr holdRegistration, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if !hr.implied || len(hr.regs) != 1 || len(hr.remoteKeys()) != 1 || hr.segments() != nil || hr.regionAddr != 1000 || len(b.extents) != 1 {
			t.Fatalf("want one implied key: %+v, %d RegisterExtents calls", hr, len(b.extents))
		}
		got := b.extents[0]
		if len(got) != len(exts) || !slices.IsSortedFunc(got, func(x, y transport.Extent) int { return int(x.Off) - int(y.Off) }) {
			t.Fatalf("extents %v: want the hold's %d extents sorted by offset", got, len(exts))
		}
	}
	perExtent := func(t *testing.T, b *extentBackend, hr holdRegistration, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if hr.implied || len(b.extents) != 0 || len(hr.regs) != len(exts) || len(hr.remoteKeys()) != len(exts) || len(hr.segments()) != len(exts) {
			t.Fatalf("want %d registrations with a segment each: %+v", len(exts), hr)
		}
		for i, s := range hr.segments() {
			if s.Rkey != uint32(i) || s.Length != exts[i].Len || s.RemoteAddr != hr.regs[i].RemoteAddr() {
				t.Fatalf("segment %d = %+v, extent %+v", i, s, exts[i])
			}
		}
	}

	t.Run("extent keys", func(t *testing.T) {
		b := &extentBackend{caps: transport.Caps{ExtentKeys: true}}
		hr, err := registerHold(b, region(kvmem.MemoryMemfd), blocks)
		oneKey(t, b, hr, err)
	})
	t.Run("per extent", func(t *testing.T) {
		b := &extentBackend{caps: transport.Caps{AllocationExtentKeys: true}}
		hr, err := registerHold(b, region(kvmem.MemoryMemfd), blocks)
		perExtent(t, b, hr, err)
	})
	t.Run("extent keys on the backend's own allocation", func(t *testing.T) {
		b := &extentBackend{caps: transport.Caps{AllocationExtentKeys: true}}
		hr, err := registerHold(b, region(kvmem.MemoryAllocated("fake")), blocks)
		oneKey(t, b, hr, err)
	})
	t.Run("another backend's allocation", func(t *testing.T) {
		b := &extentBackend{caps: transport.Caps{AllocationExtentKeys: true}}
		hr, err := registerHold(b, region(kvmem.MemoryAllocated("other")), blocks)
		perExtent(t, b, hr, err)
	})
	for _, c := range []struct {
		name string
		caps transport.Caps
		at   int
	}{{"extent key fails", transport.Caps{ExtentKeys: true}, 1}, {"third extent fails", transport.Caps{}, 3}} {
		t.Run(c.name, func(t *testing.T) {
			b := &extentBackend{caps: c.caps, failAt: c.at}
			hr, err := registerHold(b, region(kvmem.MemoryMemfd), blocks)
			if err == nil || hr.regs != nil {
				t.Fatalf("want an error and no registrations: %v, %+v", err, hr)
			}
			for i, r := range b.regs {
				if !r.dead {
					t.Fatalf("registration %d left registered after the failure", i)
				}
			}
		})
	}
}
