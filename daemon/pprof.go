package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// profiles serves Go's runtime profiles (pprof_listen) on a listener of
// their own: never on the router's or the metrics' port, so that no
// client of either can start a CPU profile, and off unless asked for.
type profiles struct {
	ln  net.Listener
	srv *http.Server
}

// serveProfiles starts GET /debug/pprof/ on addr.
func serveProfiles(addr string, log *slog.Logger) (*profiles, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pprof_listen=%s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	p := &profiles{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("pprof HTTP server stopped", "err", err)
		}
	}()
	return p, nil
}

// URL is where the profiles are served ("" when off).
func (p *profiles) URL() string {
	if p == nil {
		return ""
	}
	return "http://" + p.ln.Addr().String() + "/debug/pprof/"
}

func (p *profiles) close() {
	if p != nil {
		_ = p.srv.Close()
	}
}
