package tcp

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// TestRegisterExtents exposes two extents of one buffer under one key:
// reads inside an extent return its bytes; reads in the gap, across an
// extent's end or past the buffer fail with ErrNotRegistered.
func TestRegisterExtents(t *testing.T) {
	server := openBackend(t, Config{})
	client := openBackend(t, Config{})
	mem := randomBytes(7, 4096)
	reg, err := server.RegisterExtents(mem, []transport.Extent{{Off: 10, Len: 5}, {Off: 100, Len: 200}, {Off: 4000, Len: 96}})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Deregister()
	ep := connect(t, client, server)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	get := func(off, n uint64) ([]byte, error) {
		dst := make([]byte, n)
		err := ep.Get(ctx, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + off, Dst: dst}})
		return dst, err
	}
	for _, ok := range [][2]uint64{{10, 5}, {11, 3}, {100, 200}, {150, 150}, {4000, 96}} {
		got, err := get(ok[0], ok[1])
		if err != nil || !bytes.Equal(got, mem[ok[0]:ok[0]+ok[1]]) {
			t.Fatalf("read [%d,+%d): %v", ok[0], ok[1], err)
		}
	}
	for _, bad := range [][2]uint64{{0, 1}, {9, 2}, {14, 2}, {15, 1}, {50, 10}, {299, 2}, {300, 1}, {4095, 2}, {5000, 1}} {
		if _, err := get(bad[0], bad[1]); err == nil {
			t.Fatalf("read [%d,+%d) outside the extents succeeded", bad[0], bad[1])
		} else {
			wantErr(t, err, transport.ErrNotRegistered)
		}
	}
	for _, exts := range [][]transport.Extent{
		{{Off: 10, Len: 0}},
		{{Off: 4000, Len: 97}},
		{{Off: 100, Len: 10}, {Off: 105, Len: 10}},
		{{Off: 200, Len: 10}, {Off: 100, Len: 10}},
	} {
		if _, err := server.RegisterExtents(mem, exts); err == nil {
			t.Fatalf("bad extents %v accepted", exts)
		}
	}
}
