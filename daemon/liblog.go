package daemon

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
)

// libHandler is the log handler protoactor gets. Its records pass through
// unchanged until the daemon begins to stop; from then on its errors are
// logged at info: a normal stop closes every remote stream, and protoactor
// reports each closing one as an ERROR ("EndpointWriter lost connection",
// "failed to send disconnection message"), which an operator would read as
// a fault. Before that, a lost connection that a graceful stop caused (ours
// or the peer's: closedOnPurpose) is logged at info too.
type libHandler struct {
	slog.Handler
	stopping *atomic.Bool
}

func (h libHandler) level(l slog.Level) slog.Level {
	if h.stopping.Load() && l >= slog.LevelError {
		return slog.LevelInfo
	}
	return l
}

// Enabled implements slog.Handler.
func (h libHandler) Enabled(ctx context.Context, l slog.Level) bool {
	// An error may still be downgraded in Handle: let it through.
	return h.Handler.Enabled(ctx, h.level(l)) || (l >= slog.LevelError && h.Handler.Enabled(ctx, l))
}

// Handle implements slog.Handler.
func (h libHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Level = h.level(r.Level)
	if r.Level >= slog.LevelError && closedOnPurpose(r) {
		r.Level = slog.LevelInfo
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

// closedOnPurpose reports protoactor's "EndpointWriter lost connection" for a
// stream that ended because one side chose to end it:
//   - this process closed it (gRPC code Canceled: "the client connection is
//     closing"), which it does when a peer leaves the cluster gracefully;
//   - the peer's gRPC server stopped gracefully (it sent a GOAWAY whose debug
//     data is "graceful_stop", which grpc-go's Server.GracefulStop sends and
//     nothing else does): the peer left on purpose. protoactor closes its
//     streams to a peer when the peer's leave reaches it, but its cluster
//     keeps talking to the peer for the two seconds a graceful
//     Cluster.Shutdown waits, which opens new streams that only the peer's
//     stop closes; the "member left ... reason=leave" line already said so.
//
// A connection that really broke (a peer killed or cut off) reports
// Unavailable without that GOAWAY and stays an error.
func closedOnPurpose(r slog.Record) bool {
	if r.Message != "EndpointWriter lost connection" {
		return false
	}
	ended := false
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != "error" {
			return true
		}
		e := a.Value.String()
		ended = strings.Contains(e, "code = Canceled") ||
			strings.Contains(e, "received prior goaway") && strings.Contains(e, `"graceful_stop"`)
		return false
	})
	return ended
}

// WithAttrs implements slog.Handler.
func (h libHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return libHandler{Handler: h.Handler.WithAttrs(as), stopping: h.stopping}
}

// WithGroup implements slog.Handler.
func (h libHandler) WithGroup(name string) slog.Handler {
	return libHandler{Handler: h.Handler.WithGroup(name), stopping: h.stopping}
}
