package natsbus

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
)

func TestDataDirIsLocked(t *testing.T) {
	dir := t.TempDir()
	first, err := Open(Options{Listen: "127.0.0.1:0", DataDir: dir, Name: "first"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Listen: "127.0.0.1:0", DataDir: dir, Name: "second"}); !errors.Is(err, ErrDataDirLocked) {
		t.Fatalf("a second embedded server on the same data_dir: %v, want ErrDataDirLocked", err)
	}
	first.Close()
	again, err := Open(Options{Listen: "127.0.0.1:0", DataDir: dir, Name: "again"})
	if err != nil {
		t.Fatalf("the lock must be released by Close: %v", err)
	}
	again.Close()
}

func TestTakenPortIsAnError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = Open(Options{Listen: ln.Addr().String(), DataDir: t.TempDir(), Name: "x"})
	if err == nil || !strings.Contains(err.Error(), "nats_listen="+ln.Addr().String()) || !strings.Contains(err.Error(), "nats_url") {
		t.Fatalf("a taken nats_listen: %v", err)
	}
}

// recorder keeps the messages of the records it handles.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Level.String()+" "+rec.Message)
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// TestEmbeddedServerLogsThroughOurs: the embedded nats-server's log goes
// to our logger (its routine notices at debug), not to nowhere.
func TestEmbeddedServerLogsThroughOurs(t *testing.T) {
	rec := &recorder{}
	b, err := Open(Options{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Name: "logs", Logger: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, m := range rec.msgs {
		if strings.HasPrefix(m, "DEBUG Server is ready") {
			return
		}
	}
	t.Fatalf("no nats-server notice reached our logger: %q", rec.msgs)
}
