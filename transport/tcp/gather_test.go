package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// TestGatherChunksPacks: small chunks of one registration go as GATHERs of
// at most MaxGatherSegments parts and gatherBytes, enough of them for the
// Get's connections; large, empty and lone chunks as planned; every chunk
// exactly once.
func TestGatherChunksPacks(t *testing.T) {
	mem := make([]byte, 64<<20)
	k1, k2 := remoteKey{id: 1}, remoteKey{id: 2}
	var chunks []chunk
	add := func(k remoteKey, off, n int) {
		chunks = append(chunks, chunk{op: len(chunks), key: k, off: uint64(off), dst: mem[off : off+n : off+n], to: scatter{n: n}})
	}
	for i := range 300 { // interleaved, as a TP rank's halves are
		add(k1, i*32<<10, 16<<10)
		add(k2, i*32<<10+16<<10, 16<<10)
	}
	add(k1, 40<<20, 4<<20) // large: a GET of its own
	add(k2, 50<<20, 0)     // empty: a GET, checked by the holder
	add(remoteKey{id: 3}, 60<<20, 100)

	out := gatherChunks(chunks, 4<<20, 8)
	seen := make(map[int]int) // chunk op -> times covered
	var gathers int
	for _, c := range out {
		if c.to.parts == nil {
			seen[c.op]++
			continue
		}
		gathers++
		if len(c.to.parts) < 2 || len(c.to.parts) > MaxGatherSegments || c.to.n > gatherBytes {
			t.Fatalf("gather of %d parts, %d bytes", len(c.to.parts), c.to.n)
		}
		at := 0
		for _, p := range c.to.parts {
			if p.at != at {
				t.Fatalf("part at %d, want %d", p.at, at)
			}
			at += p.n
			// find the chunk the part came from
			var from *chunk
			for i := range chunks {
				if chunks[i].off == p.off && chunks[i].key == c.key {
					from = &chunks[i]
				}
			}
			if from == nil || p.n != from.to.n || &p.dst[0] != &from.dst[0] {
				t.Fatalf("part %+v matches no chunk of key %d", p, c.key.id)
			}
			seen[from.op]++
		}
		if at != c.to.n {
			t.Fatalf("parts sum to %d, gather says %d", at, c.to.n)
		}
	}
	for i := range chunks {
		if seen[i] != 1 {
			t.Fatalf("chunk %d covered %d times", i, seen[i])
		}
	}
	// 600 chunks of 16 KiB, 9600 KiB: at least 8 requests, each at most
	// 1 MiB (64 parts).
	if gathers < 10 || gathers > 20 {
		t.Fatalf("%d gathers for 600 16 KiB chunks", gathers)
	}

	// A small Get still spreads over its connections: 64 pieces of
	// 4 KiB, 8 requests wanted.
	chunks = chunks[:0]
	for i := range 64 {
		add(k1, i*8<<10, 4<<10)
	}
	if out := gatherChunks(chunks, 4<<20, 8); len(out) != 8 {
		t.Fatalf("64 chunks of 4 KiB went as %d requests, want 8", len(out))
	}
	// Never more than ChunkBytes in one request.
	for _, c := range gatherChunks(chunks, 16<<10, 1) {
		if c.to.n > 16<<10 {
			t.Fatalf("a gather of %d bytes; ChunkBytes is 16 KiB", c.to.n)
		}
	}
}

// TestIovAtCoversEveryPiece: reading a GATHER's payload through iovAt in
// reads of any size puts every payload byte in its place, contiguous and
// scattered parts alike, and touches no byte between pieces.
func TestIovAtCoversEveryPiece(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 200 {
		dst := make([]byte, 1<<16)
		want := make([]int, len(dst)) // payload offset expected at each dst byte, -1 for none
		for i := range want {
			want[i] = -1
		}
		var s scatter
		pos := 0
		for range 1 + rng.IntN(20) {
			p := part{at: s.n}
			if rng.IntN(2) == 0 {
				n := 1 + rng.IntN(500)
				p.n, p.dst = n, dst[pos:pos+n]
				for j := range n {
					want[pos+j] = s.n + j
				}
				pos += n + rng.IntN(10)
			} else {
				p.piece = 1 + rng.IntN(64)
				p.stride = p.piece + rng.IntN(64)
				count := 1 + rng.IntN(8)
				p.n = count * p.piece
				span := (count-1)*p.stride + p.piece
				p.dst = dst[pos : pos+span]
				for j := range count {
					for b := range p.piece {
						want[pos+j*p.stride+b] = s.n + j*p.piece + b
					}
				}
				pos += span + rng.IntN(10)
			}
			s.parts = append(s.parts, p)
			s.n += p.n
		}
		for i := range dst {
			dst[i] = 0xEE
		}
		payload := make([]byte, s.n)
		for i := range payload {
			payload[i] = byte(i*7 + i>>8)
		}
		var iov [maxReadIov][]byte
		for got := 0; got < s.n; {
			v := s.iovAt(nil, got, iov[:rng.IntN(maxReadIov)+1][:0])
			budget := 1 + rng.IntN(300)
			for _, p := range v {
				k := copy(p[:min(len(p), budget)], payload[got:])
				got, budget = got+k, budget-k
				if budget == 0 {
					break
				}
			}
		}
		for i := range dst {
			switch {
			case want[i] < 0 && dst[i] != 0xEE:
				t.Fatalf("trial %d: byte %d outside every piece was written", trial, i)
			case want[i] >= 0 && dst[i] != payload[want[i]]:
				t.Fatalf("trial %d: dst byte %d holds %#x, want payload byte %d (%#x)", trial, i, dst[i], want[i], payload[want[i]])
			}
		}
	}
}

// requestsSent is how many requests ep's connections have sent.
func requestsSent(ep transport.Endpoint) uint64 {
	e := ep.(*endpointRef).e
	e.mu.Lock()
	defer e.mu.Unlock()
	var n uint64
	for _, c := range e.slots {
		if c != nil {
			c.mu.Lock()
			n += c.nextID
			c.mu.Unlock()
		}
	}
	return n
}

// TestGatherGets: once the holder has said it speaks version 2, a Get of
// many small ops of two registrations (and strided ops) goes as a few
// GATHERs and reads every byte right, over plain TCP (readv) and TLS
// (reads through the buffer).
func TestGatherGets(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testGatherGets(t, Config{}) })
	t.Run("tls", func(t *testing.T) { testGatherGets(t, tlsConfigs(testCA(t, "gather"))) })
}

func testGatherGets(t *testing.T, cfg Config) {
	server := openBackend(t, cfg)
	// No hedging: the counts below compare requests sent with requests
	// served, which a connection cut and resent on a loaded machine would
	// skew.
	cfg.HedgeAfter = -1
	client := openBackend(t, cfg)
	memA, memB := randomBytes(1, 4<<20), randomBytes(2, 4<<20)
	ra, rb := register(t, server, memA), register(t, server, memB)
	ep := connect(t, client, server)
	rng := rand.New(rand.NewPCG(1, 2))
	dst := make([]byte, 8<<20)
	type src struct {
		mem []byte
		off int
	}
	var ops []transport.GetOp
	var srcs []src
	pos := 0
	for i := range 800 {
		n := 1 + rng.IntN(20<<10)
		mem, key := memA, ra.RemoteKey()
		if i%2 == 1 {
			mem, key = memB, rb.RemoteKey()
		}
		off := rng.IntN(len(mem) - n)
		ops = append(ops, transport.GetOp{RemoteKey: key, RemoteAddr: uint64(off), Dst: dst[pos : pos+n : pos+n]})
		srcs = append(srcs, src{mem, off})
		pos += n + rng.IntN(100)
	}
	check := func(what string) {
		t.Helper()
		for i, op := range ops {
			if !bytes.Equal(op.Dst, srcs[i].mem[srcs[i].off:srcs[i].off+len(op.Dst)]) {
				t.Fatalf("%s: op %d read wrong bytes", what, i)
			}
		}
		clear(dst)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ep.Get(ctx, ops); err != nil {
		t.Fatal(err)
	}
	check("first Get")
	if !ep.(*endpointRef).e.gathers() {
		t.Fatal("the endpoint did not learn that the holder speaks version 2")
	}
	before := requestsSent(ep)
	gets, gathers := counter(t, server, "tcp_gets_served"), counter(t, server, "tcp_gathers_served")
	if err := ep.Get(ctx, ops); err != nil {
		t.Fatal(err)
	}
	check("gathered Get")
	sent := requestsSent(ep) - before
	if sent > 100 {
		t.Fatalf("%d requests for 800 small ops: not gathered", sent)
	}
	// The holder counts what it served (Caps.Counters).
	dGets, dGathers := counter(t, server, "tcp_gets_served")-gets, counter(t, server, "tcp_gathers_served")-gathers
	if dGathers == 0 || dGets+dGathers != sent {
		t.Fatalf("holder counted %d GETs and %d GATHERs served; the reader sent %d requests", dGets, dGathers, sent)
	}

	// Strided ops: pieces back to back at the holder (scattered parts)
	// and pieces strided at the holder (a part each).
	var sops []transport.StridedOp
	for i := range 200 {
		piece, count := 1+rng.IntN(1024), 1+rng.IntN(16)
		rstride := uint64(piece)
		if i%3 == 0 {
			rstride += uint64(rng.IntN(64))
		}
		dstride := piece + rng.IntN(64)
		span := (count-1)*dstride + piece
		off := rng.IntN(len(memA) - count*int(rstride) - piece)
		sops = append(sops, transport.StridedOp{RemoteKey: ra.RemoteKey(), RemoteAddr: uint64(off), RemoteStride: rstride,
			Dst: dst[i*40<<10 : i*40<<10+span], DstStride: dstride, Len: piece, Count: count})
	}
	before = requestsSent(ep)
	if err := ep.GetStrided(ctx, sops); err != nil {
		t.Fatal(err)
	}
	for i, op := range sops {
		for j := range op.Count {
			got := op.Dst[j*op.DstStride : j*op.DstStride+op.Len]
			at := int(op.RemoteAddr) + j*int(op.RemoteStride)
			if !bytes.Equal(got, memA[at:at+op.Len]) {
				t.Fatalf("strided op %d piece %d read wrong bytes", i, j)
			}
		}
	}
	if sent := requestsSent(ep) - before; sent > 100 {
		t.Fatalf("%d requests for 200 strided ops: not gathered", sent)
	}
}

// serveV1 is a holder of protocol version 1 as connexd before GATHER: it
// closes a connection whose hello offers another version, and answers
// GETs from mem (key id 1, any secret). It records the versions offered
// and the ops it was sent.
type serveV1 struct {
	mem      []byte
	mu       sync.Mutex
	versions []uint8
	ops      []uint8
}

func (s *serveV1) serve(_ int, c net.Conn) {
	var hello [helloLen]byte
	if _, err := io.ReadFull(c, hello[:]); err != nil {
		return
	}
	s.mu.Lock()
	s.versions = append(s.versions, hello[4])
	s.mu.Unlock()
	if hello[4] != 1 {
		_ = c.Close()
		return
	}
	if _, err := c.Write(appendHello(nil, 1)); err != nil {
		return
	}
	var frame [requestLen]byte
	for {
		if _, err := io.ReadFull(c, frame[:]); err != nil {
			return
		}
		s.mu.Lock()
		s.ops = append(s.ops, frame[1])
		s.mu.Unlock()
		if frame[1] != opGet {
			_ = c.Close() // version 1 knows no other op a reader sends here
			return
		}
		n := binary.BigEndian.Uint32(frame[4:])
		off := binary.BigEndian.Uint64(frame[32:])
		resp := make([]byte, responseLen)
		putResponse(resp, response{id: binary.BigEndian.Uint64(frame[8:]), status: statusOK, length: n})
		if _, err := c.Write(append(resp, s.mem[off:off+uint64(n)]...)); err != nil {
			return
		}
	}
}

// TestOlderHolder: a holder that speaks only version 1 closes the reader's
// first connection (its hello offers 2); the reader offers 1 from then on
// and reads with GETs only.
func TestOlderHolder(t *testing.T) {
	old := &serveV1{mem: randomBytes(3, 1<<20)}
	peer := newRawPeer(t, old.serve)
	client := openBackend(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ep, err := client.Connect(ctx, []byte(peer.ln.Addr().String()))
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	key := encodeKey(remoteKey{id: 1, secret: [8]byte{1}})
	dst := make([]byte, 64<<10)
	var ops []transport.GetOp
	for i := range 64 {
		ops = append(ops, transport.GetOp{RemoteKey: key, RemoteAddr: uint64(i * 8 << 10), Dst: dst[i<<10 : (i+1)<<10]})
	}
	for range 2 {
		clear(dst)
		if err := ep.Get(ctx, ops); err != nil {
			t.Fatalf("Get from a version 1 holder: %v", err)
		}
		for i, op := range ops {
			if !bytes.Equal(op.Dst, old.mem[op.RemoteAddr:op.RemoteAddr+1024]) {
				t.Fatalf("op %d read wrong bytes", i)
			}
		}
	}
	if n := counter(t, client, "tcp_protocol_fallbacks"); n != 1 {
		t.Fatalf("tcp_protocol_fallbacks = %d after one holder refused version 2, want 1", n)
	}
	old.mu.Lock()
	defer old.mu.Unlock()
	if len(old.versions) < 2 || old.versions[0] != ProtocolVersion || old.versions[len(old.versions)-1] != 1 {
		t.Fatalf("hellos offered %v; want %d, then 1", old.versions, ProtocolVersion)
	}
	for _, op := range old.ops {
		if op != opGet {
			t.Fatalf("a version 1 holder was sent op %d", op)
		}
	}
}

// TestOlderReader: a reader whose hello offers version 1 is answered in
// version 1, served GETs, and a GATHER on its connection is a protocol
// error that closes it.
func TestOlderReader(t *testing.T) {
	server := openBackend(t, Config{})
	mem := randomBytes(4, 1<<16)
	c, k := rawReader(t, server, mem)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	frames := appendHello(nil, 1)
	frames = appendRequest(frames, request{id: 1, key: k, offset: 100, length: 10})
	if _, err := c.Write(frames); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, helloLen+responseLen+10)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if v, err := decodeHello(got[:helloLen]); err != nil || v != 1 {
		t.Fatalf("server hello: version %d, %v; want 1", v, err)
	}
	if !bytes.Equal(got[helloLen+responseLen:], mem[100:110]) {
		t.Fatal("GET on a version 1 connection read wrong bytes")
	}
	g := appendGather(nil, request{id: 2, key: k, length: 20, segs: []segment{{0, 10}, {20, 10}}})
	if _, err := c.Write(g); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(got); err != io.EOF && !isClosedErr(err) {
		t.Fatalf("after a GATHER on a version 1 connection: read %d bytes, %v; want the connection closed", n, err)
	}
}

// TestGatherFrameInPiecesIsNotIdle: a reader that sends a GATHER's frame in
// pieces, each within IdleTimeout of the one before, keeps its connection:
// the holder renews the idle deadline before every read of a frame, not
// only of a frame's first 40 bytes.
func TestGatherFrameInPiecesIsNotIdle(t *testing.T) {
	const idle = time.Second
	server := openBackend(t, Config{IdleTimeout: idle, ClientIdle: idle / 3})
	c, k := rawReader(t, server, randomBytes(5, 4096))
	gather := func(id uint64) []byte {
		segs := make([]segment, 8)
		for i := range segs {
			segs[i] = segment{offset: uint64(i * 64), length: 8}
		}
		return appendGather(nil, request{id: id, key: k, length: 64, segs: segs})
	}
	const rounds = 5
	want := helloLen + (2*rounds+2)*responseLen + (rounds+1)*(8+64)
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, want)
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err := io.ReadFull(c, buf)
		got <- err
	}()
	// Each write ends inside a GATHER's segments; the rest follows 0.4 of
	// IdleTimeout later (the pacing of a slow reader is the scenario; the
	// rest of IdleTimeout is slack for a loaded machine).
	pending := gather(1)
	first := append(appendHello(nil, ProtocolVersion), appendRequest(nil, request{id: 100, key: k, length: 8})...)
	if _, err := c.Write(append(first, pending[:requestLen+8]...)); err != nil {
		t.Fatal(err)
	}
	for i := range rounds + 1 {
		time.Sleep(2 * idle / 5)
		out := pending[requestLen+8:]
		if i < rounds {
			pending = gather(uint64(2 + i))
			out = append(append(out, appendRequest(nil, request{id: uint64(101 + i), key: k, length: 8})...), pending[:requestLen+8]...)
		}
		if _, err := c.Write(out); err != nil {
			t.Fatalf("round %d: %v (the holder closed the connection as idle?)", i, err)
		}
	}
	if err := <-got; err != nil {
		t.Fatalf("reading every answer: %v (the holder closed the connection as idle?)", err)
	}
}

// TestRefusalsNeedEvidence: a connection closed before its hello by a
// holder that spoke version 2 (shed, restarting) leaves the endpoint at
// version 2; a second in a row (or one before any hello) makes it offer 1,
// and it offers 2 again reofferAfter later.
func TestRefusalsNeedEvidence(t *testing.T) {
	e := newEndpoint(&Backend{cfg: DefaultConfig(), log: testLogger()}, "holder")
	e.refused(ProtocolVersion)
	if e.gathers() || e.offer() != minProtocolVersion {
		t.Fatal("a close before any hello: still offering version 2")
	}
	e.learned(gatherVersion, ProtocolVersion)
	if !e.gathers() || e.offer() != ProtocolVersion {
		t.Fatal("a version 2 hello: not offering version 2")
	}
	e.learned(minProtocolVersion, minProtocolVersion) // says nothing of the holder
	if !e.gathers() {
		t.Fatal("an answer to an offer of 1 downgraded the endpoint")
	}
	e.refused(ProtocolVersion)
	if !e.gathers() || e.offer() != ProtocolVersion {
		t.Fatal("one shed connection downgraded an endpoint whose holder speaks version 2")
	}
	e.refused(ProtocolVersion)
	if e.gathers() || e.offer() != minProtocolVersion {
		t.Fatal("two closes in a row: still offering version 2")
	}
	e.downgraded.Store(monoNow() - int64(reofferAfter) - 1)
	if e.offer() != ProtocolVersion {
		t.Fatal("reofferAfter after the refusal: not offering version 2 again")
	}
}

// TestGatherOnVersion1ConnectionGoesAsGets: GATHERs planned while the
// holder spoke version 2, sent on connections that offer 1 (the endpoint
// was downgraded meanwhile), are read as their parts' GETs.
func TestGatherOnVersion1ConnectionGoesAsGets(t *testing.T) {
	server := openBackend(t, Config{})
	client := openBackend(t, Config{})
	mem := randomBytes(6, 1<<20)
	reg := register(t, server, mem)
	ep := connect(t, client, server)
	dst := make([]byte, 1<<20)
	var ops []transport.GetOp
	for i := range 128 {
		ops = append(ops, transport.GetOp{RemoteKey: reg.RemoteKey(), RemoteAddr: uint64((127 - i) * 8192), Dst: dst[i*8192 : i*8192+4096]})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ep.Get(ctx, ops); err != nil { // learns version 2
		t.Fatal(err)
	}
	e := ep.(*endpointRef).e
	chunks, err := planChunks(ops, e.b.cfg.ChunkBytes)
	if err != nil {
		t.Fatal(err)
	}
	chunks = e.gather(chunks)
	if len(chunks) >= len(ops) {
		t.Fatalf("%d chunks for %d ops: not gathered", len(chunks), len(ops))
	}
	e.proto.Store(minProtocolVersion)
	e.downgraded.Store(monoNow())
	e.mu.Lock()
	for _, c := range e.slots {
		if c != nil {
			c.abort(errIdle) // redialed, offering 1
		}
	}
	e.mu.Unlock()
	clear(dst)
	if err := e.getChunks(ctx, nil, chunks, nil); err != nil {
		t.Fatalf("GATHERs on version 1 connections: %v", err)
	}
	for i, op := range ops {
		if !bytes.Equal(op.Dst, mem[op.RemoteAddr:op.RemoteAddr+4096]) {
			t.Fatalf("op %d read wrong bytes", i)
		}
	}
}

// counter is the value of b's counter name (Backend.Counters).
func counter(t *testing.T, b *Backend, name string) uint64 {
	t.Helper()
	for _, c := range b.Counters() {
		if c.Name == name {
			return c.Value()
		}
	}
	t.Fatalf("no counter %q", name)
	return 0
}
