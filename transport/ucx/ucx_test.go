//go:build ucx && cgo

package ucx

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// tlsCases are the transport lists every data-path test runs with: UCX's
// default choice (shared memory here) and TCP only (peer error handling on).
var tlsCases = []string{"", "tcp"}

func tlsName(tls string) string {
	if tls == "" {
		return "default"
	}
	return tls
}

func openT(t testing.TB, tls string) *Backend {
	t.Helper()
	b, err := OpenConfig(transport.Options{}, Config{TLS: tls})
	if err != nil {
		t.Fatalf("open ucx (tls %q): %v", tls, err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func randBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16)})
	r.Read(b)
	return b
}

func connectT(t testing.TB, r *Backend, h *Backend) transport.Endpoint {
	t.Helper()
	ep, err := r.Connect(context.Background(), h.Address())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { ep.Close() })
	return ep
}

func getT(ep transport.Endpoint, d time.Duration, ops []transport.GetOp) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return ep.Get(ctx, ops)
}

// TestCloseOnOldUCXLeavesWorkers: on UCX 1.13 and older (whose
// ucp_worker_destroy aborts the process when a peer died mid wire-up)
// Close leaves the worker undestroyed and counts it; on later UCX it
// destroys it. Both Backends here have a peer (a Get between them), and
// a Get after Close fails as before.
func TestCloseOnOldUCXLeavesWorkers(t *testing.T) {
	major, minor, release := libVersion()
	old := major < 1 || (major == 1 && minor <= 13)
	if destroyAborts() != old {
		t.Fatalf("UCX %d.%d.%d: destroyAborts() = %v, want %v", major, minor, release, destroyAborts(), old)
	}
	before := AbandonedWorkers()
	p := pullOnce(t, "", 4096, 7)
	p.r.Close()
	p.h.Close()
	want := int64(0)
	if old {
		want = 2
	}
	if got := AbandonedWorkers() - before; got != want {
		t.Fatalf("UCX %d.%d.%d: Close left %d workers undestroyed, want %d", major, minor, release, got, want)
	}
	if err := getT(p.ep, time.Second, p.op); err == nil {
		t.Fatal("a Get after Close succeeded")
	}
}

func TestGetByteExact(t *testing.T) {
	for _, tls := range tlsCases {
		t.Run(tlsName(tls), func(t *testing.T) {
			h, r := openT(t, tls), openT(t, tls)
			src := randBytes(32<<20, 1)
			reg, err := h.Register(src)
			if err != nil {
				t.Fatal(err)
			}
			ep := connectT(t, r, h)
			key, base := reg.RemoteKey(), reg.RemoteAddr()

			// One contiguous GET of the whole region.
			dst := make([]byte, len(src))
			if err := getT(ep, 10*time.Second, []transport.GetOp{{RemoteKey: key, RemoteAddr: base, Dst: dst}}); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dst, src) {
				t.Fatal("contiguous GET: bytes differ")
			}

			// Many scattered ops of 1 B .. 32 KiB; every 4th one continues
			// the previous one in both remote and local memory (coalesced).
			rng := rand.New(rand.NewPCG(2, 3))
			out := make([]byte, 3000*(32<<10+64))
			var ops []transport.GetOp
			var want [][]byte
			pos := 0
			for i := 0; i < 3000; i++ {
				n := 1 + rng.IntN(32<<10)
				off := rng.IntN(len(src) - n)
				if i%4 == 3 {
					prev := ops[len(ops)-1]
					poff := int(prev.RemoteAddr - base)
					if poff+len(prev.Dst)+n <= len(src) {
						off = poff + len(prev.Dst)
						pos -= 64 // undo the gap: contiguous destination
					}
				}
				ops = append(ops, transport.GetOp{RemoteKey: key, RemoteAddr: base + uint64(off), Dst: out[pos : pos+n]})
				want = append(want, src[off:off+n])
				pos += n + 64
			}
			if err := getT(ep, 10*time.Second, ops); err != nil {
				t.Fatal(err)
			}
			for i := range ops {
				if !bytes.Equal(ops[i].Dst, want[i]) {
					t.Fatalf("op %d (remote +%d, %d bytes): bytes differ", i, ops[i].RemoteAddr-base, len(want[i]))
				}
			}
		})
	}
}

// kvOps returns the GETs of a KV layout: layers x {K,V} x blocks pieces of
// block bytes each, read in a shuffled block order into a contiguous dst, so
// that nothing coalesces.
func kvOps(reg transport.Registration, dst []byte, pieces, block int, seed uint64) ([]transport.GetOp, []int) {
	perm := rand.New(rand.NewPCG(seed, seed)).Perm(pieces)
	ops := make([]transport.GetOp, pieces)
	key := reg.RemoteKey()
	for i, p := range perm {
		ops[i] = transport.GetOp{RemoteKey: key, RemoteAddr: reg.RemoteAddr() + uint64(p*block), Dst: dst[i*block : (i+1)*block]}
	}
	return ops, perm
}

func TestGetLarge(t *testing.T) {
	if testing.Short() {
		t.Skip("256 MiB transfer")
	}
	h, r := openT(t, ""), openT(t, "")
	src := randBytes(256<<20, 4)
	reg, err := h.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	ep := connectT(t, r, h)
	dst := make([]byte, len(src))
	t0 := time.Now()
	if err := getT(ep, 20*time.Second, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: dst}}); err != nil {
		t.Fatal(err)
	}
	t.Logf("256 MiB contiguous: %v", time.Since(t0))
	if !bytes.Equal(dst, src) {
		t.Fatal("256 MiB GET: bytes differ")
	}
	// 32 layers x K,V x 64 blocks of 32 KiB, shuffled.
	const block = 32 << 10
	kv := dst[:4096*block]
	clear(kv)
	ops, perm := kvOps(reg, kv, 4096, block, 5)
	t0 = time.Now()
	if err := getT(ep, 20*time.Second, ops); err != nil {
		t.Fatal(err)
	}
	t.Logf("4096 x 32 KiB pieces: %v", time.Since(t0))
	for i, p := range perm {
		if !bytes.Equal(kv[i*block:(i+1)*block], src[p*block:(p+1)*block]) {
			t.Fatalf("piece %d (block %d): bytes differ", i, p)
		}
	}
	// Deregister right after a pull must not wait for lost acknowledgements:
	// every reply's completion arrives, so it never has to force-close.
	t0 = time.Now()
	if err := reg.Deregister(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Deregister after a pull: %v", time.Since(t0))
	if n := forcedDeregs(h); n != 0 {
		t.Fatalf("Deregister after a pull force-closed endpoints (%d): replies never completed", n)
	}
}

func TestGetOutsideRegistration(t *testing.T) {
	h, r := openT(t, ""), openT(t, "")
	mem := randBytes(1<<20, 6)
	// Register only the middle; the bytes around it must stay unreadable.
	reg, err := h.Register(mem[4096 : len(mem)-4096])
	if err != nil {
		t.Fatal(err)
	}
	ep := connectT(t, r, h)
	key, base, n := reg.RemoteKey(), reg.RemoteAddr(), uint64(reg.Len())
	dst := make([]byte, 8192)
	for _, c := range []struct {
		name string
		addr uint64
		len  int
	}{
		{"before", base - 4096, 4096},
		{"straddles start", base - 1, 2},
		{"straddles end", base + n - 1, 2},
		{"past end", base + n, 1},
		{"huge", base, 1 << 30},
		{"wraps", ^uint64(0) - 10, 100},
	} {
		d := dst[:min(c.len, len(dst))]
		if c.len > len(dst) {
			d = make([]byte, c.len)
		}
		err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: key, RemoteAddr: c.addr, Dst: d}})
		if !errors.Is(err, transport.ErrNotRegistered) {
			t.Errorf("%s: got %v, want ErrNotRegistered", c.name, err)
		}
	}

	// The holder checks too: a key whose extent was widened, or whose
	// token was altered, is refused by the holder, not only by our reader.
	wide := bytes.Clone(key)
	binary.LittleEndian.PutUint64(wide[4:], base-4096)
	binary.LittleEndian.PutUint64(wide[12:], n+8192)
	err = getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: wide, RemoteAddr: base - 4096, Dst: dst[:4096]}})
	if !errors.Is(err, transport.ErrNotRegistered) {
		t.Errorf("widened key: got %v, want ErrNotRegistered from the holder", err)
	}
	forged := bytes.Clone(key)
	forged[len(forged)-1] ^= 1
	err = getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: forged, RemoteAddr: base, Dst: dst[:16]}})
	if !errors.Is(err, transport.ErrNotRegistered) {
		t.Errorf("wrong token: got %v, want ErrNotRegistered from the holder", err)
	}
	for _, bad := range [][]byte{nil, []byte("127.0.0.1:1234"), key[:10], append([]byte("cxk1"), make([]byte, 30)...)} {
		err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: bad, RemoteAddr: base, Dst: dst[:16]}})
		if !errors.Is(err, transport.ErrBadKey) {
			t.Errorf("key %q: got %v, want ErrBadKey", bad, err)
		}
	}
	if _, err := r.Connect(context.Background(), []byte("127.0.0.1:1")); err == nil {
		t.Error("connect to a non-UCX address succeeded")
	}
	// An op with no bytes is a no-op, and a valid op still works.
	if err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: key, RemoteAddr: base, Dst: nil}, {RemoteKey: key, RemoteAddr: base, Dst: dst[:100]}}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst[:100], mem[4096:4196]) {
		t.Fatal("bytes differ")
	}
}

func TestDeregisterThenGet(t *testing.T) {
	for _, tls := range tlsCases {
		t.Run(tlsName(tls), func(t *testing.T) {
			p := pullOnce(t, tls, 1<<20, 7)
			h, ep, reg, op, src, dst := p.h, p.ep, p.reg, p.op, p.src, p.dst
			if err := reg.Deregister(); err != nil {
				t.Fatal(err)
			}
			if err := reg.Deregister(); err != nil {
				t.Fatalf("second Deregister: %v", err)
			}
			clear(dst)
			if err := getT(ep, 5*time.Second, op); !errors.Is(err, transport.ErrNotRegistered) {
				t.Fatalf("GET after Deregister: got %v, want ErrNotRegistered", err)
			}
			if bytes.Equal(dst[:64], src[:64]) {
				t.Fatal("GET after Deregister returned the old bytes")
			}
			// A fresh endpoint does not help either.
			ep2 := connectT(t, openT(t, tls), h)
			if err := getT(ep2, 5*time.Second, op); !errors.Is(err, transport.ErrNotRegistered) {
				t.Fatalf("GET after Deregister on a new endpoint: got %v, want ErrNotRegistered", err)
			}
			// A new registration of the same memory gets a new key.
			reg2, err := h.Register(src)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Equal(reg2.RemoteKey(), reg.RemoteKey()) {
				t.Fatal("re-registration reused the old key")
			}
			if err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: reg2.RemoteKey(), RemoteAddr: reg2.RemoteAddr(), Dst: dst}}); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dst, src) {
				t.Fatal("bytes differ")
			}
		})
	}
}

func TestAllocOneSided(t *testing.T) {
	h, r := openT(t, ""), openT(t, "")
	reg, err := h.Alloc(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	src := randBytes(8<<20, 8)
	copy(reg.Bytes(), src)
	ep := connectT(t, r, h)
	dst := make([]byte, len(src))
	if err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: dst}}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("bytes differ")
	}
	// One-sided: it works while the holder's progress loop is stalled.
	resume := pauseHolder(t, h)
	defer resume()
	clear(dst)
	if err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: dst}}); err != nil {
		t.Fatalf("GET with the holder stalled: %v", err)
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("bytes differ")
	}
}

// pauseHolder stalls h's owner goroutine (it stops progressing) until the
// returned function is called.
func pauseHolder(t testing.TB, h *Backend) func() {
	t.Helper()
	stalled, release := make(chan struct{}), make(chan struct{})
	if !h.w.submit(func() { close(stalled); <-release }) {
		t.Fatal("holder closed")
	}
	<-stalled
	var once sync.Once
	return func() { once.Do(func() { close(release) }) }
}

func TestGetDeadlineStalledHolder(t *testing.T) {
	for _, tls := range tlsCases {
		t.Run(tlsName(tls), func(t *testing.T) {
			p := pullOnce(t, tls, 16<<20, 9)
			h, r, ep, op, src, dst := p.h, p.r, p.ep, p.op, p.src, p.dst
			resume := pauseHolder(t, h)
			defer resume()

			const deadline = 300 * time.Millisecond
			took, err := getWithin(t, ep, deadline, op)
			t.Logf("stalled holder: %v after %v", err, took)
			if !errors.Is(err, transport.ErrTimeout) {
				t.Fatalf("got %v, want ErrTimeout", err)
			}

			// Cancel once the Get waits on the stalled holder.
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- ep.Get(ctx, op) }()
			checkFor(t, 5*time.Second, time.Millisecond, func() error {
				if postedBatches(r) == 0 {
					return errors.New("the Get is not posted yet")
				}
				return nil
			})
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, transport.ErrCanceled) {
					t.Fatalf("canceled GET: got %v, want ErrCanceled", err)
				}
			case <-time.After(hangGuard):
				t.Fatalf("canceled GET still running after %v", hangGuard)
			}

			// Once the holder runs again, the endpoint reconnects and works;
			// late replies to the canceled GETs are dropped.
			resume()
			clear(dst)
			if err := getT(ep, 5*time.Second, op); err != nil {
				t.Fatalf("GET after the holder resumed: %v", err)
			}
			if !bytes.Equal(dst, src) {
				t.Fatal("bytes differ")
			}
		})
	}
}

func TestConcurrentGets(t *testing.T) {
	h, r := openT(t, ""), openT(t, "")
	src := randBytes(8<<20, 10)
	reg, err := h.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ep, err := r.Connect(context.Background(), h.Address())
			if err != nil {
				errs <- err
				return
			}
			defer ep.Close()
			dst := make([]byte, 1<<20)
			for i := 0; i < 20; i++ {
				off := (g*20 + i) * 4096 % (len(src) - len(dst))
				if err := getT(ep, 5*time.Second, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr() + uint64(off), Dst: dst}}); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(dst, src[off:off+len(dst)]) {
					errs <- fmt.Errorf("goroutine %d get %d: bytes differ", g, i)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestCloseSemantics(t *testing.T) {
	h, r := openT(t, ""), openT(t, "")
	src := randBytes(4096, 11)
	reg, err := h.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := r.Connect(context.Background(), h.Address())
	if err != nil {
		t.Fatal(err)
	}
	op := []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: make([]byte, 4096)}}
	ep2, err := r.Connect(context.Background(), h.Address())
	if err != nil {
		t.Fatal(err)
	}
	ep.Close()
	if err := ep.Close(); err != nil {
		t.Fatal(err)
	}
	if err := getT(ep, time.Second, op); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Get on closed endpoint: %v", err)
	}
	if err := getT(ep2, 5*time.Second, op); err != nil { // the shared one is still open
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := getT(ep2, time.Second, op); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Get after backend Close: %v", err)
	}
	h.Close()
	if err := reg.Deregister(); err != nil {
		t.Fatalf("Deregister after Close: %v", err)
	}
	if _, err := h.Register(src); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Register after Close: %v", err)
	}
	if _, err := h.Connect(context.Background(), r.Address()); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Connect after Close: %v", err)
	}
}

func TestAvailable(t *testing.T) {
	if !Available() {
		t.Fatal("Available() is false in a ucx build on a machine with libucx")
	}
	b := openT(t, "")
	if b.Name() != "ucx" || len(b.Address()) == 0 {
		t.Fatalf("name %q, address %d bytes", b.Name(), len(b.Address()))
	}
}

// TestForgedReplyIsNotTaken: a checked GET's slot ids are predictable and
// UCX does not say who sent an active message, so anyone who can reach the
// reader's worker (or another holder it pulls from) could answer its GETs
// with bytes of their own. A reply counts only if it carries the GET's
// random nonce: a forged one, right slot or not, is refused and the GET
// still gets the holder's bytes.
func TestForgedReplyIsNotTaken(t *testing.T) {
	h, r := openT(t, ""), openT(t, "")
	src := bytes.Repeat([]byte("honest-KV-bytes."), 256)
	reg, err := h.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	ep := connectT(t, r, h)
	dst := make([]byte, len(src))
	resume := pauseHolder(t, h)
	defer resume()
	done := make(chan error, 1)
	go func() {
		done <- getT(ep, 10*time.Second, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: dst}})
	}()
	// onReader runs f on the reader's worker goroutine.
	onReader := func(f func()) {
		t.Helper()
		ran := make(chan struct{})
		if !r.w.submit(func() { f(); close(ran) }) {
			t.Fatal("reader closed")
		}
		<-ran
	}
	var slots []uint64
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		onReader(func() { slots = r.w.armedSlots() })
		if len(slots) == 0 {
			return errors.New("the GET has not been posted yet")
		}
		return nil
	})
	forged := bytes.Repeat([]byte("EVIL"), len(src)/4)
	var before, after int64
	onReader(func() {
		before = r.w.deliverReply(0, 0, 0, nil) // names no slot: refused
		for _, s := range slots {
			after = r.w.deliverReply(s, 0x5eed, 0, forged) // the right slot, a guessed nonce
			after = r.w.deliverReply(s, 0, -1, nil)        // an error status costs nothing to forge
		}
	})
	if want := before + 2*int64(len(slots)); after != want {
		t.Fatalf("%d replies refused after the forgeries, want %d", after, want)
	}
	select {
	case err := <-done:
		t.Fatalf("the GET ended on a forged reply: %v, dst %q…", err, dst[:16])
	default:
	}
	resume()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, src) {
		t.Fatalf("the GET read %q…, want the holder's bytes", dst[:16])
	}
}
