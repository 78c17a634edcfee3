// Package natsbus connects connexd to NATS: it starts an embedded nats-server
// with JetStream when no URL is configured, and keeps one client connection
// that reconnects forever, logging every loss and recovery.
package natsbus

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/connex/connex/auth"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"
)

// Options say which NATS to use.
type Options struct {
	URL     string // external server(s); empty starts an embedded server
	Listen  string // embedded server's client address, host:port (port 0 = any)
	DataDir string // embedded server's JetStream storage lives in DataDir/jetstream
	Name    string // client connection name and embedded server name
	Logger  *slog.Logger

	// Authority, if set, makes the embedded server trust it (operator
	// mode): every client needs credentials it signed. Nil leaves an
	// embedded server open to any client that reaches its address.
	Authority *auth.Authority
	// Creds are this client's credentials (a .creds file's contents);
	// empty connects without.
	Creds []byte
	// InboxPrefix is the prefix of this client's reply subjects; with
	// authentication it must be the one its identity may subscribe to
	// (auth.Identity.InboxPrefix).
	InboxPrefix string
	// TLS: CAFile verifies the server; CertFile and KeyFile are this
	// client's certificate (mutual TLS) and, for an embedded server, the
	// certificate it serves (clients must then trust its CA).
	TLSCAFile, TLSCertFile, TLSKeyFile string

	// MaxConnections bounds the embedded server's client connections (0:
	// DefaultMaxConnections), clamped to half the process's descriptor
	// limit: connections past it are refused by the server before they
	// authenticate.
	MaxConnections int
	// EngineConnections bounds the connections of one engine identity on
	// the embedded server with an Authority (0: DefaultEngineConnections);
	// engines together hold at most three quarters of MaxConnections.
	EngineConnections int
}

// Bus is a NATS client connection and, if embedded, its server.
type Bus struct {
	Conn    *nats.Conn
	Server  *server.Server // nil when connected to an external server
	URL     string         // client URL of the server in use
	log     *slog.Logger
	lock    *os.File // the data_dir lock of an embedded server, held until Close
	closing atomic.Bool
	closed  chan struct{} // closed by the connection's ClosedHandler
	limiter *connLimiter  // engine connection limits of an embedded server with an Authority
}

// EngineConnsRefused is how many engine connections the embedded server
// closed for being over their limits (0 without one).
func (b *Bus) EngineConnsRefused() uint64 {
	if b.limiter == nil {
		return 0
	}
	return b.limiter.refused.Load()
}

// Open starts or connects to NATS.
func Open(o Options) (*Bus, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	b := &Bus{URL: o.URL, log: log, closed: make(chan struct{})}
	if o.URL == "" {
		lock, err := lockDataDir(o.DataDir)
		if err != nil {
			return nil, err
		}
		b.lock = lock
		if o.MaxConnections, err = maxConnections(o.MaxConnections, log); err != nil {
			b.Close()
			return nil, err
		}
		srv, err := startEmbedded(o)
		if err != nil {
			b.Close()
			return nil, err
		}
		b.Server = srv
		b.URL = srv.ClientURL()
		if o.Authority != nil {
			per := o.EngineConnections
			if per <= 0 {
				per = DefaultEngineConnections
			}
			if b.limiter, err = startConnLimiter(srv, o.Authority, per, o.MaxConnections, log); err != nil {
				b.Close()
				return nil, err
			}
		}
	}
	opts, err := clientOptions(o)
	if err != nil {
		b.Close()
		return nil, err
	}
	nc, err := nats.Connect(b.URL, append(opts,
		nats.Name(o.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		// nats_url's servers in the order given: the operator lists the
		// host's own server first (docs/operating.md, "Production topology"), and the
		// others are where connexd goes when that one is gone.
		nats.DontRandomize(),
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
	)...)
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
	} else {
		// nats-server would only log the failed listen and never become
		// ready: find out now, with the reason.
		ln, err := net.Listen("tcp", o.Listen)
		if err != nil {
			return nil, fmt.Errorf("bus: nats_listen=%s cannot be used: %w (is another connexd or NATS server listening there? set nats_url to join it, or pick another nats_listen)", o.Listen, err)
		}
		_ = ln.Close()
	}
	opts := &server.Options{
		MaxConn:    o.MaxConnections,
		ServerName: o.Name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   filepath.Join(o.DataDir, "jetstream"),
		NoSigs:     true,
		NoLog:      true,
	}
	if o.Authority != nil {
		if err := trust(opts, o.Authority); err != nil {
			return nil, err
		}
	}
	if o.TLSCertFile != "" || o.TLSKeyFile != "" {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: o.TLSCertFile, KeyFile: o.TLSKeyFile})
		if err != nil {
			return nil, fmt.Errorf("bus: embedded nats tls (nats_tls_cert=%s nats_tls_key=%s): %w", o.TLSCertFile, o.TLSKeyFile, err)
		}
		opts.TLSConfig, opts.TLS = tc, true
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("bus: embedded nats: %w", err)
	}
	if o.Logger != nil {
		srv.SetLoggerV2(serverLog{log: o.Logger.With("lib", "nats-server")}, false, false, false)
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
	b.limiter.close()
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
	if b.lock != nil {
		_ = b.lock.Close() // releases the flock
		b.lock = nil
	}
}

// maxConnections is the embedded server's connection limit: want (0: the
// default), at most half the process's descriptor limit, so connections
// cannot take the descriptors the process needs for everything else.
func maxConnections(want int, log *slog.Logger) (int, error) {
	if want < 0 {
		return 0, fmt.Errorf("bus: nats_max_connections=%d: want a positive number", want)
	}
	if want == 0 {
		want = DefaultMaxConnections
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Cur != unix.RLIM_INFINITY && uint64(want) > rl.Cur/2 {
		half := int(rl.Cur / 2)
		if half < 64 {
			return 0, fmt.Errorf("bus: the descriptor limit (ulimit -n %d) leaves no room for NATS connections", rl.Cur)
		}
		log.Warn("nats_max_connections lowered to half the descriptor limit", "asked", want, "max_connections", half, "ulimit_n", rl.Cur)
		want = half
	}
	return want, nil
}

// ErrDataDirLocked means another process runs an embedded NATS server on
// the same data_dir: two JetStream servers on one store directory corrupt it.
var ErrDataDirLocked = errors.New("bus: data_dir is in use by another process")

// lockDataDir takes an exclusive lock on dir/connexd.lock (creating dir),
// held while the returned file stays open.
func lockDataDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("bus: data_dir=%s: %w", dir, err)
	}
	path := filepath.Join(dir, "connexd.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("bus: data_dir lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s is locked (another connexd embedding NATS there?); give each connexd its own data_dir", ErrDataDirLocked, path)
		}
		return nil, fmt.Errorf("bus: data_dir lock %s: %w", path, err)
	}
	return f, nil
}
