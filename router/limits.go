package router

import (
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Defaults of the router's HTTP limits (Config fields left zero take them).
// They keep a router alive under clients that open connections and send
// nothing, send a body a byte at a time, or ask for more work than the
// engines can start: each such client costs a file descriptor and a
// goroutine, and the router's process may also host the embedded NATS
// server, which needs descriptors of its own.
const (
	// DefaultReadHeaderTimeout: a client has this long to send its headers.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultReadTimeout: a client has this long to send headers and body.
	DefaultReadTimeout = 60 * time.Second
	// DefaultIdleTimeout: a keep-alive connection with no request is closed
	// after this long.
	DefaultIdleTimeout = 120 * time.Second
	// DefaultMaxConns: open client connections; the next waits in the
	// kernel's accept queue until one closes.
	DefaultMaxConns = 4096
	// DefaultMaxInFlight: completions served at once; the next is answered
	// 503 with Retry-After.
	DefaultMaxInFlight = 256
	// retryAfter is what an overloaded router tells clients to wait.
	retryAfter = 1 * time.Second
)

// cappedListener accepts at most cap connections at once: Accept waits
// for a slot before taking a connection from the kernel, so that a flood
// of idle connections waits in the accept queue instead of using this
// process's file descriptors.
type cappedListener struct {
	net.Listener
	slots chan struct{}
	done  chan struct{}
	once  sync.Once
}

func newCappedListener(ln net.Listener, cap int) *cappedListener {
	return &cappedListener{Listener: ln, slots: make(chan struct{}, cap), done: make(chan struct{})}
}

// Accept waits for a free slot, then for a connection.
func (l *cappedListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &slotConn{Conn: c, free: func() { <-l.slots }}, nil
}

// Close stops the listener and wakes an Accept waiting for a slot.
func (l *cappedListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// slotConn gives its listener slot back once, on its first Close.
type slotConn struct {
	net.Conn
	once sync.Once
	free func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.free)
	return err
}

// admission bounds the completions served at once.
type admission struct{ slots chan struct{} }

func newAdmission(n int) *admission { return &admission{slots: make(chan struct{}, n)} }

// enter takes a slot if one is free; the returned func gives it back.
func (a *admission) enter() (func(), bool) {
	select {
	case a.slots <- struct{}{}:
		return func() { <-a.slots }, true
	default:
		return nil, false
	}
}

// overloaded is the answer to a request over router_max_in_flight.
func overloaded(limit int) *APIError {
	return &APIError{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: CodeOverloaded,
		Message: "the router is serving " + strconv.Itoa(limit) + " requests already (router_max_in_flight); retry after " + retryAfter.String()}
}
