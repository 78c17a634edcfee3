// Package bus connects connexd to NATS: it starts an embedded nats-server
// with JetStream when no URL is configured, and keeps one client connection
// that reconnects forever, logging every loss and recovery.
package bus

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Options say which NATS to use.
type Options struct {
	URL     string // external server(s); empty starts an embedded server
	Listen  string // embedded server's client address, host:port (port 0 = any)
	DataDir string // embedded server's JetStream storage lives in DataDir/jetstream
	Name    string // client connection name and embedded server name
	Logger  *slog.Logger
}

// Bus is a NATS client connection and, if embedded, its server.
type Bus struct {
	Conn    *nats.Conn
	Server  *server.Server // nil when connected to an external server
	URL     string         // client URL of the server in use
	log     *slog.Logger
	closing atomic.Bool
	closed  chan struct{} // closed by the connection's ClosedHandler
}

// Open starts or connects to NATS.
func Open(o Options) (*Bus, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	b := &Bus{URL: o.URL, log: log, closed: make(chan struct{})}
	if o.URL == "" {
		srv, err := startEmbedded(o)
		if err != nil {
			return nil, err
		}
		b.Server = srv
		b.URL = srv.ClientURL()
	}
	nc, err := nats.Connect(b.URL,
		nats.Name(o.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if b.closing.Load() {
				return
			}
			log.Warn("nats connection lost; reconnecting", "url", b.URL, "err", err)
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(b.closed) }),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Warn("nats connection recovered", "url", c.ConnectedUrl())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subj := ""
			if sub != nil {
				subj = sub.Subject
			}
			log.Warn("nats async error", "subject", subj, "err", err)
		}),
	)
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("bus: connect %s: %w", b.URL, err)
	}
	b.Conn = nc
	return b, nil
}

func startEmbedded(o Options) (*server.Server, error) {
	host, portStr, err := net.SplitHostPort(o.Listen)
	if err != nil {
		return nil, fmt.Errorf("bus: nats_listen=%q: %w", o.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("bus: nats_listen=%q: bad port", o.Listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		ServerName: o.Name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   filepath.Join(o.DataDir, "jetstream"),
		NoSigs:     true,
		NoLog:      true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("bus: embedded nats: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("bus: embedded nats did not become ready within 10s (is the port taken?)")
	}
	return srv, nil
}

// Close drains the connection and stops the embedded server, if any.
func (b *Bus) Close() {
	b.closing.Store(true)
	if b.Conn != nil {
		if b.Conn.Drain() == nil {
			select { // draining ends by closing the connection
			case <-b.closed:
			case <-time.After(2 * time.Second):
			}
		}
		b.Conn.Close()
	}
	if b.Server != nil {
		b.Server.Shutdown()
		b.Server.WaitForShutdown()
	}
}
