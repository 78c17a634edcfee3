package netlab

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Relay forwards TCP connections from its listen address to a target and
// holds every byte it forwards for a delay, in each direction: the latency
// `tc qdisc ... netem delay` would add, for kernels built without sch_netem
// (this machine's). Run it on the lab's gateway and have a member advertise
// it (data_advertise), and its peers' traffic crosses the bridge twice,
// delayed.
//
// It keeps at most relayWindow bytes in flight per direction, as a link
// would hold a bandwidth-delay product, so a slow reader slows the writer
// down instead of the relay buffering without bound.
type Relay struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // nanoseconds
	rate   atomic.Int64 // bytes per second per connection and direction; 0: unlimited

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// relayChunk is the most one read forwards; relayWindow / relayChunk is
// the queue's length.
const (
	relayChunk  = 64 << 10
	relayWindow = 32 << 20
)

// NewRelay listens on listen ("ip:0" for any port) and forwards each
// connection to target with delay each way.
func NewRelay(listen, target string, delay time.Duration) (*Relay, error) {
	if delay < 0 {
		return nil, fmt.Errorf("netlab: relay delay %s: want >= 0", delay)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("netlab: relay listen %s: %w", listen, err)
	}
	r := &Relay{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	r.delay.Store(int64(delay))
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Addr is the address the relay listens on.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// SetDelay changes the delay of bytes read from now on.
func (r *Relay) SetDelay(d time.Duration) { r.delay.Store(int64(max(d, 0))) }

// SetRate limits each connection's each direction to bytesPerSec from its
// next chunk on (a slow or shared link); 0 lifts the limit.
func (r *Relay) SetRate(bytesPerSec int64) { r.rate.Store(max(bytesPerSec, 0)) }

// Close stops listening, cuts every relayed connection and waits for the
// relay's goroutines.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	err := r.ln.Close()
	r.wg.Wait()
	return err
}

func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	_ = c.Close()
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		in, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.wg.Add(1)
		go r.serve(in)
	}
}

func (r *Relay) serve(in net.Conn) {
	defer r.wg.Done()
	if !r.track(in) {
		_ = in.Close()
		return
	}
	defer r.untrack(in)
	out, err := net.DialTimeout("tcp", r.target, 5*time.Second)
	if err != nil {
		return
	}
	if !r.track(out) {
		_ = out.Close()
		return
	}
	defer r.untrack(out)
	var both sync.WaitGroup
	both.Add(2)
	go func() { defer both.Done(); r.pipe(out, in) }()
	go func() { defer both.Done(); r.pipe(in, out) }()
	both.Wait()
}

// pipe copies src to dst, each chunk written once it is delay old. When src
// ends, dst's write side is closed after the last chunk; when dst fails,
// both are closed.
func (r *Relay) pipe(dst, src net.Conn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	q := make(chan chunk, relayWindow/relayChunk)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, relayChunk)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{buf[:n], time.Now().Add(time.Duration(r.delay.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	var paced time.Time // when the bytes written so far may have left at the rate
	for c := range q {
		due := c.due
		if rate := r.rate.Load(); rate > 0 {
			paced = later(paced, time.Now()).Add(time.Duration(int64(len(c.b)) * int64(time.Second) / rate))
			due = later(due, paced)
		}
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			<-timer.C
		}
		if _, err := dst.Write(c.b); err != nil {
			_ = src.Close()
			_ = dst.Close()
			for range q { // let the reader finish
			}
			return
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		if err := tc.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) {
			_ = dst.Close()
		}
		return
	}
	_ = dst.Close()
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
