package daemon

import (
	"bytes"
	"errors"
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

// TestLibHandlerQuietsAPeersGracefulStop: a stream whose peer stopped its
// gRPC server gracefully (GOAWAY "graceful_stop", as a member that leaves
// the cluster does) is not an error on this side, which is not stopping; a
// peer that vanished without one still is.
func TestLibHandlerQuietsAPeersGracefulStop(t *testing.T) {
	var buf bytes.Buffer
	var stopping atomic.Bool
	log := slog.New(libHandler{Handler: slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}), stopping: &stopping})
	// Seen in make run's router when a connexd stopped (issue 32).
	log.Error("EndpointWriter lost connection", "address", "127.0.0.1:41533", "error", errors.New(`rpc error: code = Unavailable desc = closing transport due to: connection error: desc = "error reading from server: read tcp 127.0.0.1:57892->127.0.0.1:41533: use of closed network connection", received prior goaway: code: NO_ERROR, debug data: "graceful_stop"`))
	if out := buf.String(); !strings.Contains(out, "level=INFO") || !strings.Contains(out, "graceful_stop") {
		t.Fatalf("a peer's graceful stop is logged at info, not hidden nor an error: %q", out)
	}
	for _, e := range []string{
		// A peer killed: its connection ends with no GOAWAY.
		`rpc error: code = Unavailable desc = error reading from server: EOF`,
		// A GOAWAY that is not a graceful stop (a server draining for another reason).
		`rpc error: code = Unavailable desc = closing transport due to: connection error: desc = "error reading from server: EOF", received prior goaway: code: NO_ERROR, debug data: ""`,
	} {
		buf.Reset()
		log.Error("EndpointWriter lost connection", "error", errors.New(e))
		if !strings.Contains(buf.String(), "level=ERROR") {
			t.Fatalf("%s: a connection that broke stays an error: %q", e, buf.String())
		}
	}
	buf.Reset()
	log.Error("EndpointWriter failed to connect", "error", errors.New(`debug data: "graceful_stop"`))
	if !strings.Contains(buf.String(), "level=ERROR") {
		t.Fatalf("only the lost-connection report is judged: %q", buf.String())
	}
}
