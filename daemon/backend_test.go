package daemon

import (
	"errors"
	"strings"
	"testing"

	"github.com/connex/connex/transport"
	"github.com/connex/connex/transport/tcp"
	"github.com/connex/connex/transport/ucx"
)

// TestOpenBackend: a backend is opened by name with its own config, an
// unknown name lists the allowed ones, and a failure names the backend.
func TestOpenBackend(t *testing.T) {
	open := func(c BackendConfig) (transport.Backend, error) {
		t.Helper()
		b, err := OpenBackend(c)
		if err == nil {
			t.Cleanup(func() { b.Close() })
		}
		return b, err
	}
	if _, err := open(BackendConfig{Name: "rdma"}); err == nil || err.Error() != `backend="rdma", allowed: auto, ucx, tcp` {
		t.Fatalf("unknown backend: %v", err)
	}
	b, err := open(BackendConfig{Name: "tcp", UCX: ucx.Config{Reads: "raw"}})
	if err != nil || b.Name() != "tcp" {
		t.Fatalf("tcp (a bad UCX config is not TCP's): %v", err)
	}
	if _, err := open(BackendConfig{Name: "tcp", TCP: tcp.Config{ConnsPerEndpoint: -1}}); err == nil || !strings.HasPrefix(err.Error(), "backend=tcp: ") {
		t.Fatalf("tcp with a bad config: %v", err)
	}
	want := "tcp"
	if ucx.Available() {
		want = "ucx"
		b, err := open(BackendConfig{Name: "ucx", TCP: tcp.Config{ConnsPerEndpoint: -1}})
		if err != nil || b.Name() != "ucx" {
			t.Fatalf("ucx (a bad TCP config is not UCX's): %v", err)
		}
		if _, err := open(BackendConfig{Name: "ucx", UCX: ucx.Config{Reads: "raw"}}); err == nil || !strings.HasPrefix(err.Error(), "backend=ucx: ") {
			t.Fatalf("ucx with a bad config: %v", err)
		}
	} else if _, err := open(BackendConfig{Name: "ucx"}); err == nil || !strings.HasPrefix(err.Error(), "backend=ucx: ") || !errors.Is(err, transport.ErrUnavailable) {
		t.Fatalf("ucx in a binary without it: %v", err)
	}
	if b, err := open(BackendConfig{Name: "auto"}); err != nil || b.Name() != want {
		t.Fatalf("auto: %v, want %s", err, want)
	}
}
