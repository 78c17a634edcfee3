package router

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// The errors of a connection the engine closed.
var errConnReset, errBrokenPipe error = syscall.ECONNRESET, syscall.EPIPE

// upstream is the router's HTTP/1.1 client for its legs to engines. A
// request is written with one write and its answer read on the caller's
// goroutine, over a keep-alive connection per engine kept between requests:
// net/http's Transport runs two goroutines per connection (persistConn's
// read and write loops) and hands every request and answer across them, a
// fifth of the router's CPU on instant engines (BENCHMARKS.md, make
// bench-router). Anything it does not serve (a URL other than http://) goes
// to net/http.
//
// A connection is used again only after an answer read to its end with
// clean framing (Content-Length or chunked) and without "Connection:
// close"; an error, a cancelled context, or a body closed before its end
// closes it.
type upstream struct {
	dial     func(ctx context.Context, network, addr string) (net.Conn, error)
	fallback *http.Client
	maxIdle  int           // idle connections kept per engine address
	idleFor  time.Duration // an idle connection older than this is closed, not used

	mu     sync.Mutex
	idle   map[string][]*upConn // by address, most recently used last
	closed bool
}

// upConn is one connection to an engine.
type upConn struct {
	nc      net.Conn
	br      *bufio.Reader
	addr    string
	idleAt  time.Time
	reused  bool
	scratch []byte // the request head, reused from one request to the next
}

// peekAfter is how long a connection idles before it is peeked at reuse
// (stillOpen): engines close idle connections after seconds (uvicorn: 5 s);
// one closed sooner (a restart) is met by retryFresh.
const peekAfter = time.Second

// max1xx bounds the informational answers before the answer, as net/http does.
const max1xx = 5

// maxResponseHead bounds an engine's status line and headers.
const maxResponseHead = 64 << 10

func newUpstream(fallback *http.Client, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *upstream {
	return &upstream{dial: dial, fallback: fallback, maxIdle: 64, idleFor: 60 * time.Second, idle: map[string][]*upConn{}}
}

// upResponse is an engine's answer: its status and its body, which the
// caller must Close (a body read to its end and closed gives the
// connection back).
type upResponse struct {
	Status int
	Body   io.ReadCloser
	// Length is the body's Content-Length, or -1 when the answer did not
	// say (chunked, or to the connection's end).
	Length int64
}

// post sends body to rawURL (Content-Type application/json; accept, if
// not empty, as Accept) and returns the answer's status and body once its
// headers arrived. The context bounds the whole exchange, the body's
// reading included.
func (u *upstream) post(ctx context.Context, rawURL string, body []byte, accept string) (*upResponse, error) {
	return u.do(ctx, http.MethodPost, rawURL, body, accept)
}

// get sends a GET to rawURL, as post.
func (u *upstream) get(ctx context.Context, rawURL string) (*upResponse, error) {
	return u.do(ctx, http.MethodGet, rawURL, nil, "")
}

func (u *upstream) do(ctx context.Context, method, rawURL string, body []byte, accept string) (*upResponse, error) {
	target, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("engine URL %q: %w", rawURL, err)
	}
	if target.Scheme != "http" || target.User != nil {
		return u.viaNetHTTP(ctx, method, rawURL, body, accept)
	}
	addr := target.Host
	if target.Port() == "" {
		addr = net.JoinHostPort(target.Hostname(), "80")
	}
	path := target.RequestURI()
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		c, err := u.conn(ctx, addr, attempt > 0)
		if err != nil {
			return nil, err
		}
		resp, got, err := u.exchange(ctx, c, method, target.Host, path, body, accept)
		if err == nil {
			return resp, nil
		}
		if attempt == 0 && retryFresh(c.reused, got, err) && ctx.Err() == nil {
			continue // the engine had closed the kept-alive connection: once more on a new one
		}
		return nil, err
	}
}

// retryFresh reports whether a request that failed with err on a
// connection (reused: kept alive from an earlier request; got: some of the
// answer arrived) is sent again on a new connection: only when a kept-alive
// connection ended before any of the answer, which is how an engine's
// closing of an idle connection (its keep-alive timeout) meets a request
// sent at that moment.
func retryFresh(reused, got bool, err error) bool {
	if !reused || got {
		return false
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, errConnReset) || errors.Is(err, errBrokenPipe)
}

// exchange writes the request on c and reads the answer's head; got
// reports whether any byte of the answer arrived.
func (u *upstream) exchange(ctx context.Context, c *upConn, method, host, path string, body []byte, accept string) (resp *upResponse, got bool, err error) {
	// The context's end interrupts a blocked read or write by the
	// connection's deadline; stop tells whether it fired.
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(aLongTimeAgo) })
	fail := func(e error) (*upResponse, bool, error) {
		stop()
		c.nc.Close()
		if ctx.Err() != nil {
			return nil, got, fmt.Errorf("%w (%v)", ctx.Err(), e)
		}
		return nil, got, e
	}
	h := c.scratch[:0]
	h = append(h, method...)
	h = append(h, ' ')
	h = append(h, path...)
	h = append(h, " HTTP/1.1\r\nHost: "...)
	h = append(h, host...)
	h = append(h, "\r\nUser-Agent: connex-router\r\n"...)
	if body != nil {
		h = append(h, "Content-Type: application/json\r\nContent-Length: "...)
		h = strconv.AppendInt(h, int64(len(body)), 10)
		h = append(h, "\r\n"...)
	}
	if accept != "" {
		h = append(h, "Accept: "...)
		h = append(h, accept...)
		h = append(h, "\r\n"...)
	}
	h = append(h, "\r\n"...)
	c.scratch = h
	bufs := net.Buffers{h, body}
	if _, err := bufs.WriteTo(c.nc); err != nil {
		return fail(fmt.Errorf("engine %s: writing the request: %w", c.addr, err))
	}
	for informational := 0; ; informational++ {
		status, hdr, n, err := readHead(c.br)
		got = got || n > 0
		if err != nil {
			return fail(fmt.Errorf("engine %s: reading the answer: %w", c.addr, err))
		}
		if status == http.StatusSwitchingProtocols {
			return fail(fmt.Errorf("engine %s: answered 101 Switching Protocols to a %s", c.addr, method))
		}
		if status >= 100 && status < 200 {
			if informational == max1xx {
				return fail(fmt.Errorf("engine %s: more than %d informational (1xx) answers", c.addr, max1xx))
			}
			continue // 100 Continue, 103 Early Hints: the answer follows
		}
		b, err := newUpBody(ctx, u, c, stop, method, status, hdr)
		if err != nil {
			return fail(fmt.Errorf("engine %s: %w", c.addr, err))
		}
		length := hdr.contentLength
		if hdr.chunked {
			length = -1
		}
		return &upResponse{Status: status, Body: b, Length: length}, true, nil
	}
}

// aLongTimeAgo is a deadline that has passed: it ends a blocked read or write.
var aLongTimeAgo = time.Unix(1, 0)

// upHead is what the router reads from an answer's headers.
type upHead struct {
	contentLength int64 // -1 if none
	chunked       bool
	close         bool // Connection: close, or HTTP/1.0 without keep-alive
}

// readHead reads a status line and headers; n is the bytes read.
func readHead(br *bufio.Reader) (status int, h upHead, n int, err error) {
	h.contentLength = -1
	line, err := readLine(br, &n)
	if err != nil {
		return 0, h, n, err
	}
	// HTTP/1.x SP 3DIGIT [SP reason]
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || (line[7] != '0' && line[7] != '1') || line[8] != ' ' ||
		(len(line) > 12 && line[12] != ' ') {
		return 0, h, n, fmt.Errorf("malformed status line %q", clip(line))
	}
	status, err = strconv.Atoi(string(line[9:12]))
	if err != nil || status < 100 {
		return 0, h, n, fmt.Errorf("malformed status line %q", clip(line))
	}
	http10 := line[7] == '0'
	h.close = http10
	var teSeen, clSeen bool
	for {
		line, err := readLine(br, &n)
		if err != nil {
			return 0, h, n, err
		}
		if len(line) == 0 {
			break
		}
		if n > maxResponseHead {
			return 0, h, n, fmt.Errorf("answer headers larger than %d bytes", maxResponseHead)
		}
		i := bytes.IndexByte(line, ':')
		if i <= 0 || !tokenBytes(line[:i]) {
			return 0, h, n, fmt.Errorf("malformed header line %q", clip(line))
		}
		key, val := line[:i], bytes.TrimSpace(line[i+1:])
		if !fieldValue(line[i+1:]) {
			return 0, h, n, fmt.Errorf("malformed header line %q", clip(line))
		}
		switch {
		case asciiEqualFold(key, "Content-Length"):
			cl, err := strconv.ParseInt(string(val), 10, 64)
			if err != nil || !allDigits(val) || (clSeen && cl != h.contentLength) {
				return 0, h, n, fmt.Errorf("bad Content-Length %q", clip(val))
			}
			h.contentLength, clSeen = cl, true
		case asciiEqualFold(key, "Transfer-Encoding"):
			if teSeen || !asciiEqualFold(val, "chunked") || http10 {
				return 0, h, n, fmt.Errorf("unsupported Transfer-Encoding %q", clip(val))
			}
			h.chunked, teSeen = true, true
		case asciiEqualFold(key, "Connection"):
			for _, tok := range bytes.Split(val, []byte(",")) {
				tok = bytes.TrimSpace(tok)
				if asciiEqualFold(tok, "close") {
					h.close = true
				} else if http10 && asciiEqualFold(tok, "keep-alive") {
					h.close = false
				}
			}
		}
	}
	if h.chunked {
		h.contentLength = -1 // RFC 9112 6.3: Transfer-Encoding wins, and the connection is not reused
		if clSeen {
			h.close = true
		}
	}
	return status, h, n, nil
}

// readLine reads one CRLF (or LF) terminated line, without its end,
// valid until the next read; it adds the bytes read to n.
func readLine(br *bufio.Reader, n *int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	*n += len(line)
	if err == bufio.ErrBufferFull {
		return nil, fmt.Errorf("answer header line longer than %d bytes", br.Size())
	}
	if err != nil {
		if err == io.EOF && *n > 0 {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	return line, nil
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return len(b) > 0
}

// tokenBytes reports whether b is an RFC 9110 token (a header name).
func tokenBytes(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c >= 0x7f || bytes.IndexByte([]byte(`"(),/:;<=>?@[\]{}`), c) >= 0 {
			return false
		}
	}
	return len(b) > 0
}

// fieldValue reports whether b holds no control byte but tab.
func fieldValue(b []byte) bool {
	for _, c := range b {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

func clip(b []byte) []byte {
	if len(b) > 80 {
		return b[:80]
	}
	return b
}

// upBody reads an answer's body from its connection.
type upBody struct {
	ctx   context.Context
	u     *upstream
	c     *upConn     // nil once closed or given back
	r     io.Reader   // the framed body: limited, chunked, or to EOF
	stop  func() bool // ends the context's hook on the connection
	keep  bool        // the connection may serve another request once the body is read
	chunk bool        // chunked: its trailer is read after the last chunk
	err   error       // how reading ended (io.EOF: at its end)
}

func newUpBody(ctx context.Context, u *upstream, c *upConn, stop func() bool, method string, status int, h upHead) (*upBody, error) {
	b := &upBody{ctx: ctx, u: u, c: c, stop: stop, keep: !h.close}
	switch {
	case method == http.MethodHead || status == http.StatusNoContent || status == http.StatusNotModified:
		b.r = eofReader{}
	case h.chunked:
		b.r, b.chunk = httputil.NewChunkedReader(c.br), true
	case h.contentLength >= 0:
		b.r = io.LimitReader(c.br, h.contentLength)
	default:
		b.r, b.keep = c.br, false // to the connection's end
	}
	return b, nil
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

// Read implements io.Reader.
func (b *upBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.c == nil {
		return 0, errors.New("router: read of a closed engine answer")
	}
	n, err := b.r.Read(p)
	if err == io.EOF {
		if lr, ok := b.r.(*io.LimitedReader); ok && lr.N > 0 {
			err = io.ErrUnexpectedEOF // the connection ended before Content-Length
		} else if b.chunk {
			err = b.trailer()
		}
	}
	if err != nil {
		b.err = err
		if err != io.EOF {
			b.err = b.failed(err)
		}
		b.release()
	}
	return n, b.err
}

// trailer reads a chunked body's trailer section (to its empty line),
// each line ended by CRLF (net/http takes a bare LF only where more bytes
// follow it; such an engine is refused here rather than waited for).
func (b *upBody) trailer() error {
	n := 0
	for {
		line, err := b.c.br.ReadSlice('\n')
		n += len(line)
		if err != nil {
			if err == io.EOF || err == bufio.ErrBufferFull {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("chunked answer's trailer: %w", err)
		}
		if !bytes.HasSuffix(line, []byte("\r\n")) {
			return errors.New("chunked answer's trailer: a line not ended by CRLF")
		}
		if len(line) == 2 {
			return io.EOF
		}
		if i := bytes.IndexByte(line, ':'); i <= 0 || !tokenBytes(line[:i]) || !fieldValue(line[i+1:len(line)-2]) {
			return fmt.Errorf("chunked answer's trailer: malformed line %q", clip(line))
		}
		if n > maxResponseHead {
			return errors.New("chunked answer's trailer is too large")
		}
	}
}

// failed is err as the caller sees it: the context's error if the
// context ended the read.
func (b *upBody) failed(err error) error {
	b.keep = false
	if !b.stop() { // the hook ran: the context ended
		return fmt.Errorf("engine %s: reading the answer: %w (%v)", b.c.addr, context.Cause(b.ctx), err)
	}
	return fmt.Errorf("engine %s: reading the answer: %w", b.c.addr, err)
}

// release ends the body's hold on its connection: back to the pool if it
// was read to its end cleanly, else closed.
func (b *upBody) release() {
	c := b.c
	if c == nil {
		return
	}
	b.c = nil
	if b.stop() && b.err == io.EOF && b.keep && c.br.Buffered() == 0 {
		b.u.put(c)
		return
	}
	c.nc.Close()
}

// Close implements io.Closer: a body not read to its end closes its
// connection.
func (b *upBody) Close() error {
	if b.err == nil {
		b.err = errors.New("router: read of a closed engine answer")
		b.keep = false
	}
	b.release()
	return nil
}

// conn is an idle connection to addr that is still open, or a new one
// (always when fresh).
func (u *upstream) conn(ctx context.Context, addr string, fresh bool) (*upConn, error) {
	now := time.Now()
	for !fresh {
		u.mu.Lock()
		if u.closed {
			u.mu.Unlock()
			return nil, errors.New("router: the engine client is closed")
		}
		list := u.idle[addr]
		if len(list) == 0 {
			u.mu.Unlock()
			break
		}
		c := list[len(list)-1]
		list[len(list)-1] = nil
		u.idle[addr] = list[:len(list)-1]
		u.mu.Unlock()
		if idle := now.Sub(c.idleAt); idle < u.idleFor && (idle < peekAfter || stillOpen(c.nc)) {
			c.reused = true
			return c, nil
		}
		c.nc.Close()
	}
	nc, err := u.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err // names the address
	}
	return &upConn{nc: nc, br: bufio.NewReaderSize(nc, 16<<10), addr: addr}, nil
}

// put keeps c for the next request to its address.
func (u *upstream) put(c *upConn) {
	c.idleAt = time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed || len(u.idle[c.addr]) >= u.maxIdle {
		c.nc.Close()
		return
	}
	u.idle[c.addr] = append(u.idle[c.addr], c)
}

// close closes the idle connections; answers being read still end as they
// would.
func (u *upstream) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.closed = true
	for addr, list := range u.idle {
		for _, c := range list {
			c.nc.Close()
		}
		delete(u.idle, addr)
	}
	u.fallback.CloseIdleConnections()
}

// viaNetHTTP sends a request net/http's way (a URL this client does not
// serve: https, credentials).
func (u *upstream) viaNetHTTP(ctx context.Context, method, rawURL string, body []byte, accept string) (*upResponse, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, rawURL, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := u.fallback.Do(req)
	if err != nil {
		return nil, err
	}
	return &upResponse{Status: resp.StatusCode, Body: resp.Body, Length: resp.ContentLength}, nil
}
