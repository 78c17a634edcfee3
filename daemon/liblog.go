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
// a fault.
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
	if r.Level >= slog.LevelError && closedByUs(r) {
		r.Level = slog.LevelInfo
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

// closedByUs reports protoactor's "EndpointWriter lost connection" for a
// stream this process closed itself (gRPC code Canceled: "the client
// connection is closing"), which it does when a peer leaves the cluster
// gracefully; a connection that really broke reports Unavailable.
func closedByUs(r slog.Record) bool {
	if r.Message != "EndpointWriter lost connection" {
		return false
	}
	canceled := false
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "error" && strings.Contains(a.Value.String(), "code = Canceled") {
			canceled = true
			return false
		}
		return true
	})
	return canceled
}

// WithAttrs implements slog.Handler.
func (h libHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return libHandler{Handler: h.Handler.WithAttrs(as), stopping: h.stopping}
}

// WithGroup implements slog.Handler.
func (h libHandler) WithGroup(name string) slog.Handler {
	return libHandler{Handler: h.Handler.WithGroup(name), stopping: h.stopping}
}
