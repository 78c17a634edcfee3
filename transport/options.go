package transport

import "log/slog"

// Options configure a Backend when it is opened.
type Options struct {
	// ListenAddr is where a backend that needs a listening socket binds
	// (TCP: "host:port", ":0" picks a free port). Empty means 127.0.0.1:0.
	ListenAddr string
	// Logger receives the backend's structured logs; nil means slog.Default().
	Logger *slog.Logger
}

// Log returns the configured logger or the default one.
func (o Options) Log() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default()
}
