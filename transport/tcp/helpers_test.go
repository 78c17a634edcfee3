package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/transport"

	"github.com/connex/connex/harness/poll"
)

// checkFor polls fn until it returns nil; poll.Until fails the test with
// fn's last error once total has passed.
func checkFor(t testing.TB, total, every time.Duration, fn func() error) {
	t.Helper()
	poll.Until(t, total, every, fn)
}

// hangGuard is how long a test waits, after a Get's context ended (or a
// call that must end by itself started), before it calls it hung. It is far
// above any deadline the tests set: they assert that a Get ends with its
// context and how, not how soon after (a loaded machine delays that by a
// varying amount); the overshoot is BenchmarkGetPastDeadline's figure.
const hangGuard = 10 * time.Second

// waitGet waits for the result of a Get running under ctx, sent on errc.
// A Get must end when ctx does: one still running hangGuard after that
// fails the test.
func waitGet(t testing.TB, ctx context.Context, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	select {
	case err := <-errc:
		return err
	case <-time.After(hangGuard):
		t.Fatalf("Get still running %v after its context ended (%v)", hangGuard, ctx.Err())
		return nil
	}
}

// getWithin runs ep.Get(ops) with deadline d and returns how long it took
// and its error, failing the test if it does not end with its deadline
// (waitGet).
func getWithin(t testing.TB, ep transport.Endpoint, d time.Duration, ops []transport.GetOp) (time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- ep.Get(ctx, ops) }()
	err := waitGet(t, ctx, errc)
	return time.Since(start), err
}

// testLogger discards logs unless CONNEX_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("CONNEX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// openBackend opens a backend on loopback and closes it when the test ends.
func openBackend(t testing.TB, cfg Config) *Backend {
	t.Helper()
	b, err := OpenConfig(transport.Options{Logger: testLogger()}, cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// connect opens an endpoint from client to server's address.
func connect(t testing.TB, client, server *Backend) transport.Endpoint {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ep, err := client.Connect(ctx, server.Address())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = ep.Close() })
	return ep
}

// register registers mem on b and deregisters it when the test ends.
func register(t testing.TB, b *Backend, mem []byte) transport.Registration {
	t.Helper()
	r, err := b.Register(mem)
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	t.Cleanup(func() { _ = r.Deregister() })
	return r
}

// rawReader registers mem on server and dials its data address with a bare
// TCP connection (closed when the test ends), for tests that write the
// wire's frames themselves; it returns the connection and mem's key.
func rawReader(t testing.TB, server *Backend, mem []byte) (net.Conn, remoteKey) {
	t.Helper()
	k, err := decodeKey(register(t, server, mem).RemoteKey())
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", string(server.Address()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, k
}

// randomBytes returns n bytes from a seeded generator.
func randomBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	var s [32]byte
	s[0] = byte(seed)
	s[1] = byte(seed >> 8)
	_, _ = rand.NewChaCha8(s).Read(b)
	return b
}

// wantErr fails the test unless err wraps target.
func wantErr(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("got error %v, want one wrapping %v", err, target)
	}
}

// checkNoLeaks records the goroutine count and, at cleanup (registered
// before the backends' own cleanups, so it runs after them), waits until the
// count is back to it.
func checkNoLeaks(t *testing.T) {
	t.Helper()
	base := runtime.NumGoroutine()
	t.Cleanup(func() {
		checkFor(t, 5*time.Second, 5*time.Millisecond, func() error {
			if n := runtime.NumGoroutine(); n > base {
				return fmt.Errorf("goroutines leaked: %d running, %d at start", n, base)
			}
			return nil
		})
	})
}

// serverWriting reports whether any server connection of b is writing from
// the registration r right now.
func serverWriting(b *Backend, r transport.Registration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for sc := range b.conns {
		if sc.writing.Load() == r.(*registration) {
			return true
		}
	}
	return false
}

// waitServerWriting waits (5s at most) until a server connection of b is
// writing from r.
func waitServerWriting(t testing.TB, b *Backend, r transport.Registration) {
	t.Helper()
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		if !serverWriting(b, r) {
			return errors.New("server not writing yet")
		}
		return nil
	})
}

// getWhileWriting starts a Get of reg into dst and returns once the server is
// writing from reg or the Get has ended (polling every `every`). ended says
// which; finish waits for the Get's result (at once if it had ended).
func getWhileWriting(t testing.TB, ep transport.Endpoint, server *Backend, reg transport.Registration, dst []byte, every time.Duration) (finish func() error, ended bool) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		errc <- ep.Get(context.Background(), []transport.GetOp{{RemoteKey: reg.RemoteKey(), Dst: dst}})
	}()
	var err error
	checkFor(t, 10*time.Second, every, func() error {
		select {
		case err = <-errc:
			ended = true
			return nil
		default:
		}
		if serverWriting(server, reg) {
			return nil
		}
		return errors.New("transfer not started")
	})
	return func() error {
		if !ended {
			err = <-errc
		}
		return err
	}, ended
}

// rawPeer is a TCP listener whose connections a test serves by hand: serve
// runs for each accepted connection (k counts them from 0) until it returns.
// Cleanup closes the listener and every connection, and waits for serve.
type rawPeer struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newRawPeer(t testing.TB, serve func(k int, c net.Conn)) *rawPeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &rawPeer{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for k := 0; ; k++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				serve(k, c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}
