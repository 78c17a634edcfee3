package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// checkFor polls fn every `every` until it returns nil or total passes, in
// which case the test fails with fn's last error (nats-server's helper).
func checkFor(t testing.TB, total, every time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	var err error
	for {
		if err = fn(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %v", total, err)
		}
		time.Sleep(every)
	}
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
