package daemon

import (
	"fmt"

	"github.com/connex/connex/transport"
	"github.com/connex/connex/transport/tcp"
	"github.com/connex/connex/transport/ucx"
)

// OpenBackend opens the data plane named by the backend config key: "tcp",
// "ucx" (fails if the binary lacks UCX or libucp does not load) or "auto"
// (UCX when available, else TCP). ucxReads is the ucx_reads config key
// ("checked" or "onesided"; empty means checked), used when UCX is opened.
func OpenBackend(name, ucxReads string, opts transport.Options) (transport.Backend, error) {
	cfg := ucx.Config{Options: opts, Reads: ucxReads}
	switch name {
	case "tcp":
		return openTCP(opts)
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
		return openTCP(opts)
	}
	return nil, fmt.Errorf("backend=%q, allowed: auto, ucx, tcp", name)
}

func openTCP(opts transport.Options) (transport.Backend, error) {
	b, err := tcp.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("backend=tcp: %w", err)
	}
	return b, nil
}
