package daemon

import (
	"errors"
	"net"
	"net/url"
	"syscall"
	"time"

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

// engineProbeInterval is how often connexd tries a connection to each
// registered engine's HTTP port, and engineProbeTimeout how long one try
// may take. A refused try ends the engine's registration at once (see
// advertise.Liveness): a killed engine leaves membership within about one
// interval instead of its registration TTL (3 s), so the router stops
// picking it and its /ready turns 503 when the last one of a role goes.
const (
	engineProbeInterval = 250 * time.Millisecond
	engineProbeTimeout  = 500 * time.Millisecond
)

// probe drops the registrations of engines whose process is gone, until
// stop.
func (a *engineAPI) probe() {
	live := advertise.NewLiveness()
	t, tc := a.clock.NewTimer(engineProbeInterval)
	defer t.Stop()
	dialer := &net.Dialer{Timeout: engineProbeTimeout}
	for {
		select {
		case <-a.stop:
			return
		case <-tc:
		}
		if !a.awaitRegistration() {
			return
		}
		regs := a.liveEnding()
		type outcome struct {
			id, instance string
			err          error
		}
		results := make(chan outcome, len(regs))
		n := 0
		for _, e := range regs {
			addr := dialAddr(e.GetBaseUrl())
			if addr == "" {
				continue
			}
			n++
			go func(id, instance string) {
				c, err := dialer.Dial("tcp", addr)
				if err == nil {
					_ = c.Close()
				}
				results <- outcome{id, instance, err}
			}(e.GetEngineId(), e.GetInstanceId())
		}
		registered := map[string]bool{}
		for _, e := range regs {
			registered[e.GetEngineId()] = true
		}
		live.Forget(func(id string) bool { return registered[id] })
		for range n {
			o := <-results
			switch live.Observe(o.id, o.instance, dialOutcome(o.err)) {
			case advertise.Listening:
				a.log.Info("engine listening: a refused connection to it from now on ends its registration at once", "engine", o.id)
				continue
			case advertise.Unchanged:
				continue
			}
			a.mu.Lock()
			ended, removed := a.reg.RemoveInstance(o.id, o.instance)
			a.mu.Unlock()
			if !removed {
				continue
			}
			a.log.Warn("engine's HTTP port refuses connections (its process is gone): no longer advertised", "engine", o.id, "err", o.err)
			a.advertise()
			a.engineLost(ended)
		}
		t.Reset(engineProbeInterval)
	}
}
