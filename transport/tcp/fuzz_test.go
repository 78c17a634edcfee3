package tcp

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// Every decoder has a fuzz target; `go test` runs them on their seeds, and
// `go test -fuzz FuzzServerStream ./transport/tcp/` explores further.

func FuzzDecodeHello(f *testing.F) {
	f.Add(appendHello(nil, ProtocolVersion))
	f.Add(appendHello(nil, minProtocolVersion))
	f.Add([]byte("CNXT\x03\x00\x00\x00"))
	f.Add([]byte("CNXT\x00\x00\x00\x00"))
	f.Add([]byte("CNXU\x01\x00\x00\x00"))
	f.Add([]byte("CNXT\x01\x00\x00\x01"))
	f.Add([]byte("CNXT"))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeHello(b)
		valid := len(b) == helloLen && b[4] >= minProtocolVersion && bytes.Equal(b, appendHello(nil, b[4]))
		if valid != (err == nil) || (valid && v != b[4]) {
			t.Fatalf("decodeHello(%q) = %d, %v", b, v, err)
		}
		if err != nil && !errors.Is(err, errProtocol) {
			t.Fatalf("error %v is not a protocol error", err)
		}
	})
}

func FuzzDecodeKey(f *testing.F) {
	f.Add(encodeKey(remoteKey{id: 1, secret: [8]byte{1, 2, 3}}))
	f.Add(make([]byte, KeyLen))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := decodeKey(b)
		if err != nil {
			if !errors.Is(err, transport.ErrBadKey) {
				t.Fatalf("error %v does not wrap ErrBadKey", err)
			}
			return
		}
		if !bytes.Equal(encodeKey(k), b) {
			t.Fatalf("key %x does not round-trip", b)
		}
	})
}

func FuzzDecodeRequest(f *testing.F) {
	key := remoteKey{id: 7, secret: [8]byte{9, 9, 9, 9, 9, 9, 9, 9}}
	f.Add(appendRequest(nil, request{id: 1, key: key, offset: 10, length: 100}))
	f.Add(appendRequest(nil, request{id: 1, key: key, length: MaxRequestBytes + 1}))
	f.Add(appendCancel(nil, 42))
	bad := appendCancel(nil, 42)
	bad[39] = 1
	f.Add(bad)
	f.Add(bytes.Repeat([]byte{0xC7}, requestLen))
	f.Add([]byte{frameMagic, opGet})
	g := appendGather(nil, request{id: 3, key: key, length: 30, segs: []segment{{offset: 5, length: 10}, {offset: 100, length: 20}}})
	f.Add(g[:requestLen])
	f.Add(appendGather(nil, request{id: 3, key: key, segs: make([]segment, MaxGatherSegments+1)})[:requestLen])
	f.Add(appendGather(nil, request{id: 3, key: key})[:requestLen])
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRequest(b)
		if err != nil {
			if !errors.Is(err, errProtocol) {
				t.Fatalf("error %v is not a protocol error", err)
			}
			return
		}
		if r.length > MaxRequestBytes {
			t.Fatalf("accepted length %d", r.length)
		}
		var again []byte
		switch r.op {
		case opCancel:
			again = appendCancel(nil, r.id)
		case opGather:
			if r.offset < 1 || r.offset > MaxGatherSegments {
				t.Fatalf("accepted a gather of %d segments", r.offset)
			}
			again = appendGather(nil, request{id: r.id, key: r.key, length: r.length, segs: make([]segment, r.offset)})[:requestLen]
		default:
			again = appendRequest(nil, r)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("request %x does not round-trip", b)
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	for _, r := range []response{
		{id: 1, status: statusOK, length: 100},
		{id: 2, status: statusNotRegistered},
		{id: 3, status: statusCanceled},
		{id: 4, status: statusNotRegistered, length: 5},
		{id: 5, status: 9},
		{id: 6, status: statusOK, length: MaxRequestBytes + 1},
	} {
		b := make([]byte, responseLen)
		putResponse(b, r)
		f.Add(b)
	}
	f.Add([]byte{0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeResponse(b)
		if err != nil {
			if !errors.Is(err, errProtocol) {
				t.Fatalf("error %v is not a protocol error", err)
			}
			return
		}
		if r.length > MaxRequestBytes || (r.status != statusOK && r.length != 0) {
			t.Fatalf("accepted %+v", r)
		}
		again := make([]byte, responseLen)
		putResponse(again, r)
		if !bytes.Equal(again, b) {
			t.Fatalf("response %x does not round-trip", b)
		}
	})
}

// fuzzConn is a net.Conn whose reads come from a fixed input (then EOF) and
// whose writes are collected up to a limit.
type fuzzConn struct {
	in     *bytes.Reader
	mu     sync.Mutex
	out    bytes.Buffer
	limit  int
	closed bool
}

func (c *fuzzConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	// Short reads exercise the decoders' reassembly.
	if len(p) > 7 {
		p = p[:len(p)/2+1]
	}
	return c.in.Read(p)
}

func (c *fuzzConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	if c.out.Len()+len(p) > c.limit {
		return 0, errors.New("fuzzConn: output limit exceeded")
	}
	return c.out.Write(p)
}

func (c *fuzzConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return nil
}

func (c *fuzzConn) LocalAddr() net.Addr                { return &net.TCPAddr{} }
func (c *fuzzConn) RemoteAddr() net.Addr               { return &net.TCPAddr{} }
func (c *fuzzConn) SetDeadline(t time.Time) error      { return nil }
func (c *fuzzConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *fuzzConn) SetWriteDeadline(t time.Time) error { return nil }

// FuzzServerStream feeds arbitrary bytes to a server connection holding one
// registration of 1000 'R' bytes inside a buffer of 'X' bytes. It must not
// panic or hang, must answer with well-formed frames only, and must never
// send a byte from outside the registration.
func FuzzServerStream(f *testing.F) {
	b, err := Open(transport.Options{Logger: testLogger()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = b.Close() })
	buf := bytes.Repeat([]byte{'X'}, 4096)
	copy(buf[1000:2000], bytes.Repeat([]byte{'R'}, 1000))
	tr, err := b.Register(buf[1000:2000])
	if err != nil {
		f.Fatal(err)
	}
	// A fixed secret, so seeds can name the registration.
	reg := tr.(*registration)
	reg.secret = [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	key := remoteKey{id: reg.id, secret: reg.secret}

	hello := appendHello(nil, ProtocolVersion)
	get := func(id, off uint64, n uint32) []byte {
		return appendRequest(nil, request{id: id, key: key, offset: off, length: n})
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	f.Add([]byte{})
	f.Add(hello)
	f.Add(cat(hello, get(1, 0, 1000)))
	f.Add(cat(hello, get(1, 0, 10), get(2, 990, 10), get(3, 995, 10), get(4, 1000, 0)))
	f.Add(cat(hello, get(1, 0, 10), appendCancel(nil, 1), get(2, 5, 5), appendCancel(nil, 99)))
	f.Add(cat(hello, get(1, 0, 10), get(1, 0, 10)))
	f.Add(cat(hello, get(1, 0, MaxRequestBytes)))
	f.Add(cat(hello, get(1, 1<<63, 1)))
	f.Add(cat(hello, appendRequest(nil, request{id: 1, key: remoteKey{id: reg.id}, length: 1})))
	f.Add(cat(hello, []byte{0xC7, 1, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF}))
	f.Add(cat([]byte("CNXT\x02\x00\x00\x00"), get(1, 0, 1)))
	f.Add(cat(hello, bytes.Repeat(get(7, 0, 1000), 3)))
	gather := func(id uint64, segs ...segment) []byte {
		n := uint32(0)
		for _, g := range segs {
			n += g.length
		}
		return appendGather(nil, request{id: id, key: key, length: n, segs: segs})
	}
	f.Add(cat(hello, gather(1, segment{0, 10}, segment{990, 10}), get(2, 0, 5), gather(3, segment{500, 500})))
	f.Add(cat(hello, gather(1, segment{0, 10}, segment{995, 10})))
	f.Add(cat(hello, gather(1, segment{0, 10}), appendCancel(nil, 1), gather(2, segment{1, 1}, segment{1, 1})))
	f.Add(cat(hello, gather(1, segment{0, 0}, segment{1, 1})))
	f.Add(cat(hello, gather(1, segment{0, 10})[:requestLen+8]))
	f.Add(cat(appendHello(nil, minProtocolVersion), gather(1, segment{0, 10}, segment{20, 10})))

	f.Fuzz(func(t *testing.T, data []byte) {
		// A GATHER may read the registration's 1000 bytes once per segment.
		nreq := len(data)/requestLen + 1
		limit := helloLen + nreq*(responseLen+MaxGatherSegments*1000)
		conn := &fuzzConn{in: bytes.NewReader(data), limit: limit}
		sc := &serverConn{b: b, nc: conn, raw: conn}
		done := make(chan error, 1)
		go func() { done <- sc.serve() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("server did not finish on %d input bytes", len(data))
		}
		out := conn.out.Bytes()
		if len(out) == 0 {
			return
		}
		if _, err := decodeHello(out[:min(helloLen, len(out))]); err != nil {
			t.Fatalf("server's first bytes are not a hello: %v", err)
		}
		for out = out[helloLen:]; len(out) > 0; {
			if len(out) < responseLen {
				t.Fatalf("truncated response header")
			}
			r, err := decodeResponse(out[:responseLen])
			if err != nil {
				t.Fatalf("server wrote a bad response: %v", err)
			}
			out = out[responseLen:]
			if int(r.length) > len(out) {
				t.Fatalf("truncated payload")
			}
			for _, c := range out[:r.length] {
				if c != 'R' {
					t.Fatalf("server sent a byte from outside the registration")
				}
			}
			out = out[r.length:]
		}
	})
}

// FuzzClientStream feeds arbitrary bytes as a holder's answers to a reader
// with three requests outstanding (ids 1..3: an empty GET, a GATHER of two
// ranges, an abandoned GET). It must
// not panic, must end with an error, must complete each request at most
// once, and must never write outside the requests' Dst.
func FuzzClientStream(f *testing.F) {
	hello := appendHello(nil, ProtocolVersion)
	resp := func(id uint64, status uint8, n uint32, payload byte) []byte {
		b := make([]byte, responseLen, responseLen+int(n))
		putResponse(b, response{id: id, status: status, length: n})
		return append(b, bytes.Repeat([]byte{payload}, int(n))...)
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	f.Add([]byte{})
	f.Add(cat(hello, resp(1, statusOK, 0, 0), resp(2, statusOK, 7, 'a'), resp(3, statusOK, 100, 'b')))
	f.Add(cat(hello, resp(3, statusCanceled, 0, 0), resp(2, statusNotRegistered, 0, 0)))
	f.Add(cat(hello, resp(2, statusCanceled, 0, 0)))
	f.Add(cat(hello, resp(2, statusOK, 8, 'a')))
	f.Add(cat(hello, resp(9, statusOK, 1, 'a')))
	f.Add(cat(hello, resp(2, statusOK, 7, 'a'), resp(2, statusOK, 7, 'a')))
	f.Add(cat(hello, resp(2, 7, 0, 0)))
	f.Add(cat([]byte("CNXT\x01\x00\x00"), resp(1, statusOK, 0, 0)))
	f.Add(cat(appendHello(nil, minProtocolVersion), resp(2, statusOK, 7, 'a')))
	f.Add(cat([]byte("CNXT\x03\x00\x00\x00"), resp(2, statusOK, 7, 'a')))

	f.Fuzz(func(t *testing.T, data []byte) {
		b := &Backend{cfg: DefaultConfig(), log: testLogger()}
		e := &endpoint{b: b, addr: "fuzz"}
		conn := &fuzzConn{in: bytes.NewReader(data), limit: 1 << 20}
		c := newClientConn(e, conn, ProtocolVersion)
		call := &getCall{done: make(chan *pendingReq, 3)}
		mem := bytes.Repeat([]byte{'.'}, 200)
		gather := scatter{n: 7, parts: []part{{at: 0, n: 3, off: 100, dst: mem[20:23:23]}, {at: 3, n: 4, off: 5, dst: mem[30:34:34]}}}
		tos := []scatter{{n: 0}, gather, {n: 100}}
		dsts := [][]byte{mem[10:10:10], nil, mem[40:140:140]}
		for i, dst := range dsts {
			r := &pendingReq{call: call, id: uint64(i + 1), conn: c, dst: dst, to: tos[i], abandoned: i == 2}
			c.pending[r.id] = r
		}
		c.nextID = 3
		c.abandoned = 1
		var wg sync.WaitGroup
		wg.Add(1)
		c.readLoop(&wg)
		select {
		case <-c.done:
		default:
			t.Fatalf("reader did not finish")
		}
		if c.usable() {
			t.Fatalf("connection still usable after its stream ended")
		}
		if len(call.done) != 3 {
			t.Fatalf("%d completions for 3 requests", len(call.done))
		}
		seen := map[*pendingReq]bool{}
		for range 3 {
			r := <-call.done
			if seen[r] {
				t.Fatalf("request %d completed twice", r.id)
			}
			seen[r] = true
		}
		for i, ch := range mem {
			inDst := (i >= 20 && i < 23) || (i >= 30 && i < 34) || (i >= 40 && i < 140)
			if !inDst && ch != '.' {
				t.Fatalf("reader wrote outside Dst at %d", i)
			}
			if i >= 40 && i < 140 && ch != '.' {
				t.Fatalf("reader wrote into an abandoned request's Dst")
			}
		}
	})
}
