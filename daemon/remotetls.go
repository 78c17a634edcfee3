package daemon

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/connex/connex/auth"
	"github.com/connex/connex/cluster"
	"github.com/connex/connex/config"
)

// remoteOptions is how protoactor's remote (gRPC on cluster_host) admits
// peers. With cluster_tls on, or auto and member credentials (the default
// with the embedded server's authentication), it speaks mutual TLS with a
// certificate made from those credentials (auth.MemberTLS): only members
// of this authority complete the handshake, so a local user, or an engine
// with stolen engine credentials, cannot send it a message. Off, anyone
// who reaches the port can; connexd says so at start. Either way every
// batch is checked and a handler panic ends only the sender's stream.
func remoteOptions(cfg config.Config, creds []byte, log *slog.Logger) (cluster.RemoteOptions, error) {
	ro := cluster.RemoteOptions{Logger: log.With("component", "remote")}
	if !cfg.RemoteTLS() {
		log.Warn("the cluster's remote (gRPC) accepts anyone who reaches cluster_host: no member credentials, or cluster_tls=off", "cluster_host", cfg.ClusterHost, "cluster_tls", cfg.ClusterTLS)
		return ro, nil
	}
	if len(creds) == 0 {
		return ro, errors.New("cluster_tls: this member has no NATS credentials to make its certificate from")
	}
	var err error
	if ro.ServerTLS, ro.ClientTLS, err = auth.MemberTLS(creds); err != nil {
		return ro, fmt.Errorf("cluster_tls: %w", err)
	}
	return ro, nil
}
