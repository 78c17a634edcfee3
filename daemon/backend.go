package daemon

import (
	"fmt"

	"github.com/connex/connex/transport"
	"github.com/connex/connex/transport/tcp"
	"github.com/connex/connex/transport/ucx"
)

// BackendConfig names the data plane to open and configures each backend
// with its own config type; only the named backend's is used.
type BackendConfig struct {
	// Name is the backend config key: "tcp", "ucx" (fails if the binary
	// lacks UCX or libucp does not load) or "auto" (UCX when available,
	// else TCP).
	Name string
	// Options are what every backend shares: the listen address (data_listen;
	// TCP only) and the logger.
	Options transport.Options
	// UCX carries the ucx_reads, ucx_shared_reads and shm_dir config keys.
	UCX ucx.Config
	// TCP tunes the TCP data plane (its TLS: data_tls).
	TCP tcp.Config
}

// OpenBackend opens the data plane cfg.Name names, with that backend's own
// configuration, and checks that it implements what its Caps promise
// (transport.CheckCaps). An unknown name fails with the allowed ones; a
// failure to open says which backend failed ("backend=ucx: ...").
func OpenBackend(cfg BackendConfig) (transport.Backend, error) {
	b, err := openBackend(cfg)
	if err != nil {
		return nil, err
	}
	if err := transport.CheckCaps(b); err != nil {
		_ = b.Close()
		return nil, fmt.Errorf("backend=%s: %w", b.Name(), err)
	}
	return b, nil
}

func openBackend(cfg BackendConfig) (transport.Backend, error) {
	switch cfg.Name {
	case "tcp":
		return openTCP(cfg)
	case "ucx":
		return openUCX(cfg)
	case "auto":
		if ucx.Available() {
			b, err := openUCX(cfg)
			if err == nil {
				return b, nil
			}
			cfg.Options.Log().Warn("UCX available but failed to open; using TCP", "err", err)
		}
		return openTCP(cfg)
	}
	return nil, fmt.Errorf("backend=%q, allowed: auto, ucx, tcp", cfg.Name)
}

func openUCX(cfg BackendConfig) (transport.Backend, error) {
	b, err := ucx.OpenConfig(cfg.Options, cfg.UCX)
	if err != nil {
		return nil, fmt.Errorf("backend=ucx: %w", err)
	}
	return b, nil
}

func openTCP(cfg BackendConfig) (transport.Backend, error) {
	b, err := tcp.OpenConfig(cfg.Options, cfg.TCP)
	if err != nil {
		return nil, fmt.Errorf("backend=tcp: %w", err)
	}
	return b, nil
}
