package cluster

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// endpointWriterQueueSize is the initial size of each peer's outbound
// queue. protoactor's default, 1,000,000, allocates 16 MB of pointer slots
// per peer connection up front, which the GC scans on every cycle; the
// queue grows on demand, so a small start costs nothing.
const endpointWriterQueueSize = 1024

// remoteHandshakeTimeout bounds a connection's TLS and HTTP/2 handshake on
// the remote's server (gRPC's default is 120 s): a peer that connects and
// never finishes, a stranger without a member certificate, holds a socket
// for this long at most.
const remoteHandshakeTimeout = 10 * time.Second

// RemoteOptions says how a member's protoactor remote (gRPC) accepts and
// dials peers.
type RemoteOptions struct {
	// ServerTLS and ClientTLS, both set, make the remote speak TLS: the
	// server with ServerTLS, the dialler with ClientTLS (auth.MemberTLS
	// builds a mutual pair from member credentials, so a peer without them
	// cannot complete the handshake). Both nil: plaintext gRPC, which
	// anyone who reaches the port may talk to.
	ServerTLS, ClientTLS *tls.Config
	// Logger receives refused batches and recovered panics at Warn. Nil
	// discards them.
	Logger *slog.Logger
}

// NewRemoteConfig is protoactor's remote.Configure(host, port, opts...)
// with three changes. Every batch a peer sends is checked before
// protoactor reads it and a panic in its handlers ends only that peer's
// stream (see remoteGuard): without this one malformed message from anyone
// who reaches the port kills the process. MaxRetryCount is 1 instead of 5:
// protoactor sleeps 2 s after every failed dial, so its default stalls
// messages to a dead member for about 10 s; membership, not dial retries,
// decides who is alive (0 is not allowed: protoactor then treats "never
// dialled" as connected). EndpointWriterQueueSize starts at 1024 instead of
// 1,000,000 (see endpointWriterQueueSize). With ro's TLS configs the server
// and the dialler speak TLS.
func NewRemoteConfig(host string, port int, ro RemoteOptions, opts ...remote.ConfigOption) *remote.Config {
	c := remote.Configure(host, port, opts...)
	c.MaxRetryCount = 1
	c.EndpointWriterQueueSize = endpointWriterQueueSize
	log := ro.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &remoteGuard{log: log}
	c.ServerOptions = append(c.ServerOptions, g.serverOptions()...)
	c.ServerOptions = append(c.ServerOptions, grpc.ConnectionTimeout(remoteHandshakeTimeout))
	if ro.ServerTLS != nil && ro.ClientTLS != nil {
		c.ServerOptions = append(c.ServerOptions, grpc.Creds(credentials.NewTLS(ro.ServerTLS)))
		// gRPC applies dial options in order, so this overrides
		// protoactor's default grpc.WithInsecure().
		c.DialOptions = append(c.DialOptions, grpc.WithTransportCredentials(credentials.NewTLS(ro.ClientTLS)))
	}
	return c
}
