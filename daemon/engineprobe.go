package daemon

import (
	"errors"
	"net"
	"net/url"
	"syscall"

	"github.com/connex/connex/advertise"
)

// dialOutcome classifies a connection attempt to an engine's port for
// advertise.Liveness: only a refused connection (ECONNREFUSED) says the
// process is gone.
func dialOutcome(err error) advertise.Dial {
	switch {
	case err == nil:
		return advertise.Connected
	case errors.Is(err, syscall.ECONNREFUSED):
		return advertise.Refused
	}
	return advertise.Failed
}

// dialAddr is the host:port to probe for an engine's base URL ("" if it
// has none usable).
func dialAddr(baseURL string) string {
	u, err := url.Parse(baseURL)
	if err != nil || u.Host == "" {
		return ""
	}
	if u.Port() != "" {
		return u.Host
	}
	if u.Scheme == "https" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return net.JoinHostPort(u.Hostname(), "80")
}
