package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// TestRoundTrip reads random data from two registrations with ops from 1 byte
// to 64 MiB at scattered offsets into disjoint slices of one buffer, and
// checks every byte and every gap between the slices.
func TestRoundTrip(t *testing.T) {
	checkNoLeaks(t)
	server := openBackend(t, Config{})
	client := openBackend(t, Config{})
	const sizeA, sizeB = 64<<20 + 4096, 3 << 20
	memA, memB := randomBytes(1, sizeA), randomBytes(2, sizeB)
	regA, regB := register(t, server, memA), register(t, server, memB)
	ep := connect(t, client, server)

	rng := rand.New(rand.NewPCG(3, 4))
	sizes := []int{1, 2, 7, 15, 16, 17, 4095, 4096, 4097, 32 << 10, 1 << 20,
		4<<20 - 1, 4 << 20, 4<<20 + 1, 16<<20 + 3, 64 << 20}
	for range 400 {
		sizes = append(sizes, 1+rng.IntN(48<<10))
	}
	type want struct {
		src       []byte
		dstOff, n int
	}
	var (
		ops   []transport.GetOp
		wants []want
		total int
	)
	const gap = 3
	for _, n := range sizes {
		total += n + gap
	}
	dst := bytes.Repeat([]byte{0xA5}, total)
	pos := 0
	for i, n := range sizes {
		reg, mem := regA, memA
		if n <= sizeB && i%3 == 0 {
			reg, mem = regB, memB
		}
		off := rng.IntN(len(mem) - n + 1)
		ops = append(ops, transport.GetOp{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + uint64(off), Dst: dst[pos : pos+n]})
		wants = append(wants, want{src: mem[off : off+n], dstOff: pos, n: n})
		pos += n + gap
	}
	rng.Shuffle(len(ops), func(i, j int) {
		ops[i], ops[j] = ops[j], ops[i]
		wants[i], wants[j] = wants[j], wants[i]
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ep.Get(ctx, ops); err != nil {
		t.Fatalf("get: %v", err)
	}
	for i, w := range wants {
		if !bytes.Equal(dst[w.dstOff:w.dstOff+w.n], w.src) {
			t.Fatalf("op %d (%d bytes): payload differs", i, w.n)
		}
		for g := w.dstOff + w.n; g < w.dstOff+w.n+gap; g++ {
			if dst[g] != 0xA5 {
				t.Fatalf("op %d: wrote past its Dst at %d", i, g)
			}
		}
	}

	// The endpoint is reusable, and an empty Get is a no-op.
	if err := ep.Get(ctx, nil); err != nil {
		t.Fatalf("empty get: %v", err)
	}
	one := make([]byte, 10)
	if err := ep.Get(ctx, []transport.GetOp{{RemoteKey: regB.RemoteKey(), RemoteAddr: 5, Dst: one}}); err != nil {
		t.Fatalf("second get: %v", err)
	}
	if !bytes.Equal(one, memB[5:15]) {
		t.Fatalf("second get: payload differs")
	}
}

// TestNotRegistered checks that every way of naming memory that is not (or no
// longer) registered fails with ErrNotRegistered without delivering a byte,
// and that the connection stays usable afterwards.
func TestNotRegistered(t *testing.T) {
	checkNoLeaks(t)
	server := openBackend(t, Config{})
	client := openBackend(t, Config{})

	// Register the middle of a bigger buffer; the bytes around it are
	// marked so any leak shows up in Dst.
	big := bytes.Repeat([]byte{0xEE}, 1<<20)
	lo, hi := 4096, 4096+100_000
	inner := big[lo:hi]
	copy(inner, randomBytes(5, len(inner)))
	reg := register(t, server, inner)
	gone := register(t, server, make([]byte, 100))
	_ = gone.Deregister()
	ep := connect(t, client, server)

	key := reg.RemoteKey()
	wrongSecret := append([]byte(nil), key...)
	wrongSecret[15] ^= 1
	unknownID := append([]byte(nil), key...)
	unknownID[7] += 100

	cases := []struct {
		name string
		key  []byte
		off  uint64
		n    int
	}{
		{"past end", key, uint64(len(inner)), 1},
		{"straddles end", key, uint64(len(inner)) - 10, 11},
		{"reads the byte after", key, 0, len(inner) + 1},
		{"huge offset", key, 1 << 62, 8},
		{"offset overflows", key, ^uint64(0) - 2, 8},
		{"empty past end", key, uint64(len(inner)) + 1, 0},
		{"large straddle", key, 0, len(inner) + 8<<20},
		{"wrong secret", wrongSecret, 0, 10},
		{"unknown id", unknownID, 0, 10},
		{"deregistered", gone.RemoteKey(), 0, 10},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dst := bytes.Repeat([]byte{0x11}, tc.n)
			err := ep.Get(ctx, []transport.GetOp{{RemoteKey: tc.key, RemoteAddr: tc.off, Dst: dst}})
			wantErr(t, err, transport.ErrNotRegistered)
			if i := bytes.IndexByte(dst, 0xEE); i >= 0 {
				t.Fatalf("memory outside the registration leaked into Dst at %d", i)
			}
			// A good op still works on the same endpoint.
			ok := make([]byte, 64)
			if err := ep.Get(ctx, []transport.GetOp{{RemoteKey: key, RemoteAddr: 100, Dst: ok}}); err != nil {
				t.Fatalf("good get after failure: %v", err)
			}
			if !bytes.Equal(ok, inner[100:164]) {
				t.Fatalf("good get after failure: payload differs")
			}
		})
	}

	t.Run("whole registration and empty op at end", func(t *testing.T) {
		dst := make([]byte, len(inner))
		ops := []transport.GetOp{
			{RemoteKey: key, RemoteAddr: 0, Dst: dst},
			{RemoteKey: key, RemoteAddr: uint64(len(inner)), Dst: nil},
		}
		if err := ep.Get(ctx, ops); err != nil {
			t.Fatalf("get: %v", err)
		}
		if !bytes.Equal(dst, inner) {
			t.Fatalf("payload differs")
		}
	})

	t.Run("one bad op among good ones", func(t *testing.T) {
		var ops []transport.GetOp
		for i := range 50 {
			ops = append(ops, transport.GetOp{RemoteKey: key, RemoteAddr: uint64(i * 1000), Dst: make([]byte, 1000)})
		}
		ops[25].RemoteKey = wrongSecret
		wantErr(t, ep.Get(ctx, ops), transport.ErrNotRegistered)
	})

	t.Run("malformed keys", func(t *testing.T) {
		for _, k := range [][]byte{nil, key[:15], append(key, 0), make([]byte, 16)} {
			err := ep.Get(ctx, []transport.GetOp{{RemoteKey: k, Dst: make([]byte, 1)}})
			wantErr(t, err, transport.ErrBadKey)
		}
	})
}

// TestSharedEndpoint checks that endpoints to one address share connections
// and that closing one reference leaves the other working.
func TestSharedEndpoint(t *testing.T) {
	checkNoLeaks(t)
	server := openBackend(t, Config{})
	client := openBackend(t, Config{})
	mem := randomBytes(7, 1<<20)
	reg := register(t, server, mem)
	ep1 := connect(t, client, server)
	ep2 := connect(t, client, server)
	if ep1.(*endpointRef).e != ep2.(*endpointRef).e {
		t.Fatalf("endpoints to one address are not shared")
	}
	ctx := context.Background()
	dst := make([]byte, len(mem))
	op := []transport.GetOp{{RemoteKey: reg.RemoteKey(), Dst: dst}}
	if err := ep1.Close(); err != nil {
		t.Fatal(err)
	}
	_ = ep1.Close() // idempotent
	wantErr(t, ep1.Get(ctx, op), transport.ErrClosed)
	if err := ep2.Get(ctx, op); err != nil {
		t.Fatalf("get on the remaining reference: %v", err)
	}
	if !bytes.Equal(dst, mem) {
		t.Fatalf("payload differs")
	}
	_ = ep2.Close()
	wantErr(t, ep2.Get(ctx, op), transport.ErrClosed)

	// A fresh Connect after the last reference went away reuses the
	// lingering endpoint and its connection: no dial, no handshake.
	e, c0 := ep2.(*endpointRef).e, ep2.(*endpointRef).e.slots[0]
	ep3 := connect(t, client, server)
	if ep3.(*endpointRef).e != e || e.slots[0] != c0 {
		t.Fatalf("a Connect right after the last Close did not reuse the lingering endpoint")
	}
	if err := ep3.Get(ctx, op); err != nil {
		t.Fatalf("get after reconnect: %v", err)
	}
}

// TestEndpointLingerExpires: an endpoint without references is shut down
// ClientIdle after its last Close (its connections closed), and a Connect
// after that dials a new one.
func TestEndpointLingerExpires(t *testing.T) {
	checkNoLeaks(t)
	server := openBackend(t, Config{})
	client := openBackend(t, Config{ClientIdle: 20 * time.Millisecond})
	mem := randomBytes(8, 64<<10)
	reg := register(t, server, mem)
	op := []transport.GetOp{{RemoteKey: reg.RemoteKey(), Dst: make([]byte, len(mem))}}
	ep := connect(t, client, server)
	if err := ep.Get(context.Background(), op); err != nil {
		t.Fatal(err)
	}
	e := ep.(*endpointRef).e
	_ = ep.Close()
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		client.mu.Lock()
		defer client.mu.Unlock()
		if client.endpoints[e.addr] == e {
			return errors.New("the endpoint still lingers")
		}
		return nil
	})
	// expire drops the endpoint from the table first and shuts it down
	// after releasing the backend's lock: wait for the shutdown too.
	checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.err == nil {
			return errors.New("the expired endpoint was not shut down")
		}
		return nil
	})
	ep2 := connect(t, client, server)
	if ep2.(*endpointRef).e == e {
		t.Fatal("a Connect after expiry reused the expired endpoint")
	}
	if err := ep2.Get(context.Background(), op); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentCancel runs Gets with tiny deadlines next to long Gets on the
// same shared connections: the long ones must all succeed with exact bytes,
// whatever the canceled ones do to the connections.
func TestConcurrentCancel(t *testing.T) {
	checkNoLeaks(t)
	server := openBackend(t, Config{})
	client := openBackend(t, Config{ChunkBytes: 1 << 20})
	mem := randomBytes(9, 16<<20)
	reg := register(t, server, mem)
	ep := connect(t, client, server)

	var wg sync.WaitGroup
	errs := make(chan error, 100)
	stop := make(chan struct{})
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, 2<<20)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(50+(i*37+g*101)%2000)*time.Microsecond)
				err := ep.Get(ctx, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: uint64(g) << 20, Dst: dst}})
				cancel()
				if err != nil && !errors.Is(err, transport.ErrTimeout) {
					errs <- fmt.Errorf("short get: %w", err)
					return
				}
			}
		}()
	}
	dst := make([]byte, len(mem))
	for i := range 8 {
		clear(dst)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := ep.Get(ctx, []transport.GetOp{{RemoteKey: reg.RemoteKey(), Dst: dst}})
		cancel()
		if err != nil {
			t.Fatalf("long get %d: %v", i, err)
		}
		if !bytes.Equal(dst, mem) {
			t.Fatalf("long get %d: payload differs", i)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
