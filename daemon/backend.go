package daemon

import (
	"fmt"

	"github.com/connex/connex/transport"
	"github.com/connex/connex/transport/tcp"
	"github.com/connex/connex/transport/ucx"
)

// OpenBackend opens the data plane named by the backend config key: "tcp",
// "ucx" (fails if the binary lacks UCX or libucp does not load) or "auto"
// (UCX when available, else TCP). cfg carries the ucx_reads and
// ucx_shared_reads config keys, used when UCX is opened, and the options
// of either backend; tcfg tunes the TCP data plane (its TLS: data_tls).
func OpenBackend(name string, cfg ucx.Config, tcfg tcp.Config) (transport.Backend, error) {
	opts := cfg.Options
	switch name {
	case "tcp":
		return openTCP(opts, tcfg)
	case "ucx":
		b, err := ucx.OpenConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("backend=ucx: %w", err)
		}
		return b, nil
	case "auto":
		if ucx.Available() {
			b, err := ucx.OpenConfig(cfg)
			if err == nil {
				return b, nil
			}
			opts.Log().Warn("UCX available but failed to open; using TCP", "err", err)
		}
		return openTCP(opts, tcfg)
	}
	return nil, fmt.Errorf("backend=%q, allowed: auto, ucx, tcp", name)
}

func openTCP(opts transport.Options, tcfg tcp.Config) (transport.Backend, error) {
	b, err := tcp.OpenConfig(opts, tcfg)
	if err != nil {
		return nil, fmt.Errorf("backend=tcp: %w", err)
	}
	return b, nil
}
