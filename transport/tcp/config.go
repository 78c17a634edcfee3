package tcp

import (
	"cmp"
	"crypto/tls"
	"fmt"
	"time"
)

// Config tunes the TCP backend beyond transport.Options. The zero value of
// any field means its default (DefaultConfig).
type Config struct {
	// ConnsPerEndpoint is how many TCP connections a reader opens to one
	// holder; chunks of a Get are spread over them. One or two saturate a
	// small machine; more help on long fat networks.
	ConnsPerEndpoint int
	// ChunkBytes is the largest request a reader sends; bigger GetOps are
	// split. At most MaxRequestBytes.
	ChunkBytes int
	// WindowBytes bounds the payload bytes one Get call keeps in flight.
	WindowBytes int
	// WindowOps bounds the requests one Get call keeps in flight.
	WindowOps int
	// SocketBuffer, when positive, sets SO_SNDBUF/SO_RCVBUF on every
	// connection. Zero keeps the kernel's autotuning, which on Linux grows
	// further than an explicit setting is allowed to (net.ipv4.tcp_rmem vs
	// net.core.rmem_max).
	SocketBuffer int
	// WriteTimeout is how long the server waits for a reader to accept one
	// batch of response bytes before it gives up on that connection.
	WriteTimeout time.Duration
	// HandshakeTimeout bounds how long an accepted connection may take to
	// send its hello.
	HandshakeTimeout time.Duration
	// DeregisterGrace is how long Deregister lets in-progress writes from the
	// memory finish before it closes the connections carrying them.
	DeregisterGrace time.Duration
	// MaxConns caps concurrently served connections: a connection takes
	// a slot once its handshake (TLS, then the hello) is done, and is
	// closed if none is free. Connections still in their handshake are
	// capped by the same number apart, the oldest closed to make room for
	// a new one, so connections that never finish (strangers without a
	// certificate) cannot keep a member out.
	MaxConns int
	// MaxConnsPerPeer caps the connections served to one remote address
	// (IP), so one peer cannot take every slot of MaxConns; it caps that
	// address's connections in their handshake the same way.
	MaxConnsPerPeer int
	// IdleTimeout closes a served connection that sends no request for
	// this long (after its hello, which HandshakeTimeout bounds).
	IdleTimeout time.Duration
	// ClientIdle is how long a reader keeps an unused connection before it
	// closes it itself; shorter than IdleTimeout, so that a reader never
	// sends a request on a connection the holder is about to close.
	ClientIdle time.Duration
	// HedgeAfter is how long a connection may receive nothing while it
	// carries a Get's requests before the Get cuts it and sends those
	// requests on another connection: a connection in TCP's retransmission
	// backoff under packet loss goes silent for seconds. Above Linux's
	// minimum retransmission timeout (200 ms), so that one lost segment does
	// not cost a connection, and well below a pull's stall deadline. Negative
	// never cuts.
	HedgeAfter time.Duration
	// ServerTLS, if set, makes the holder side speak TLS on every accepted
	// connection (the handshake counts against HandshakeTimeout); set
	// ClientAuth to require readers' certificates. Nil: plaintext.
	ServerTLS *tls.Config
	// ClientTLS, if set, makes readers speak TLS to holders; an empty
	// ServerName is the host of the address dialled, so a holder's
	// certificate must name its data address. Nil: plaintext.
	ClientTLS *tls.Config
}

// DefaultConfig returns the configuration Open uses.
func DefaultConfig() Config {
	return Config{
		ConnsPerEndpoint: 2,                // one per core on the 2-core reference box
		ChunkBytes:       4 << 20,          // 4 MiB: a few ms per chunk even at 1 GB/s
		WindowBytes:      32 << 20,         // 8 chunks in flight per Get
		WindowOps:        128,              // enough to hide RTT for 32 KiB pieces
		SocketBuffer:     0,                // kernel autotuning
		WriteTimeout:     10 * time.Second, // a reader stalled this long is dead
		HandshakeTimeout: 10 * time.Second, // drop silent connections
		DeregisterGrace:  time.Second,      // then cut readers that do not drain
		MaxConns:         1024,             // bounds server goroutines and buffers
		MaxConnsPerPeer:  64,               // readers open ConnsPerEndpoint each; a few processes per host
		IdleTimeout:      2 * time.Minute,  // idle connections are dropped, not kept for ever
		ClientIdle:       time.Minute,      // the reader closes first
		HedgeAfter:       300 * time.Millisecond,
	}
}

// withDefaults fills zero fields from DefaultConfig and checks the result.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	c.ConnsPerEndpoint = cmp.Or(c.ConnsPerEndpoint, d.ConnsPerEndpoint)
	c.ChunkBytes = cmp.Or(c.ChunkBytes, d.ChunkBytes)
	c.WindowBytes = cmp.Or(c.WindowBytes, d.WindowBytes)
	c.WindowOps = cmp.Or(c.WindowOps, d.WindowOps)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, d.WriteTimeout)
	c.HandshakeTimeout = cmp.Or(c.HandshakeTimeout, d.HandshakeTimeout)
	c.DeregisterGrace = cmp.Or(c.DeregisterGrace, d.DeregisterGrace)
	c.MaxConns = cmp.Or(c.MaxConns, d.MaxConns)
	c.MaxConnsPerPeer = cmp.Or(c.MaxConnsPerPeer, d.MaxConnsPerPeer)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, d.IdleTimeout)
	c.ClientIdle = cmp.Or(c.ClientIdle, d.ClientIdle)
	c.HedgeAfter = cmp.Or(c.HedgeAfter, d.HedgeAfter)
	switch {
	case c.ConnsPerEndpoint < 0 || c.ConnsPerEndpoint > 64:
		return c, fmt.Errorf("tcp config: ConnsPerEndpoint %d out of range 1..64", c.ConnsPerEndpoint)
	case c.ChunkBytes < 0 || c.ChunkBytes > MaxRequestBytes:
		return c, fmt.Errorf("tcp config: ChunkBytes %d out of range 1..%d", c.ChunkBytes, MaxRequestBytes)
	case c.WindowBytes < 0:
		return c, fmt.Errorf("tcp config: negative WindowBytes %d", c.WindowBytes)
	case c.WindowOps < 0:
		return c, fmt.Errorf("tcp config: negative WindowOps %d", c.WindowOps)
	case c.SocketBuffer < 0:
		return c, fmt.Errorf("tcp config: negative SocketBuffer %d", c.SocketBuffer)
	case c.WriteTimeout < 0 || c.HandshakeTimeout < 0 || c.DeregisterGrace < 0:
		return c, fmt.Errorf("tcp config: negative timeout")
	case c.MaxConns < 0 || c.MaxConnsPerPeer < 0:
		return c, fmt.Errorf("tcp config: negative MaxConns %d or MaxConnsPerPeer %d", c.MaxConns, c.MaxConnsPerPeer)
	case c.IdleTimeout < 0 || c.ClientIdle < 0:
		return c, fmt.Errorf("tcp config: negative idle timeout")
	case c.ClientIdle >= c.IdleTimeout:
		return c, fmt.Errorf("tcp config: ClientIdle %s must be shorter than IdleTimeout %s", c.ClientIdle, c.IdleTimeout)
	}
	return c, nil
}
