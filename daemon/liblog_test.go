package daemon

import (
	"bytes"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
)

func TestLibHandlerQuietsErrorsOnlyWhileStopping(t *testing.T) {
	var buf bytes.Buffer
	var stopping atomic.Bool
	log := slog.New(libHandler{Handler: slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}), stopping: &stopping}).With("lib", "protoactor")
	log.Error("EndpointWriter lost connection")
	if !strings.Contains(buf.String(), "level=ERROR") {
		t.Fatalf("before the stop an error stays an error: %q", buf.String())
	}
	buf.Reset()
	log.Error("EndpointWriter lost connection", "error", "rpc error: code = Canceled desc = grpc: the client connection is closing")
	if buf.Len() != 0 {
		t.Fatalf("a stream this process closed (a peer left gracefully) is not an error: %q", buf.String())
	}
	log.Error("EndpointWriter lost connection", "error", "rpc error: code = Unavailable desc = connection refused")
	if !strings.Contains(buf.String(), "level=ERROR") {
		t.Fatalf("a connection that broke stays an error: %q", buf.String())
	}
	buf.Reset()
	stopping.Store(true)
	log.Error("EndpointWriter lost connection")
	log.Warn("still a warning")
	if out := buf.String(); strings.Contains(out, "lost connection") || !strings.Contains(out, "level=WARN msg=\"still a warning\" lib=protoactor") {
		t.Fatalf("while stopping, errors go to info (hidden at warn) and the rest is unchanged: %q", out)
	}
}
