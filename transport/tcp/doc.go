// Package tcp is Connex's pure-Go data plane: one-sided GETs served over
// plain TCP for machines without libucx.
//
// A Backend both serves its registered memory (a listener on
// transport.Options.ListenAddr) and reads from other backends (Endpoints,
// cached per address and shared by reference count). The holder's CPU sends
// the bytes (reads are not one-sided), but no user-space copy is made on
// either side: the server hands registered memory straight to writev, and
// the reader's readv(2) lands each payload in the caller's GetOp.Dst and, in
// the same call, what follows it (the next response's header, and the start
// of its payload: the few bytes that pass through a 4 KiB buffer): one system
// call per response (recvbuf.go; TLS connections read as bufio does).
//
// # Remote keys
//
// A remote key is 16 bytes: an 8-byte big-endian registration id followed by
// 8 random secret bytes from crypto/rand. RemoteAddr is 0, so byte i of a
// registration is at offset i. A GET is served only when the id names a live
// registration, the secret matches (compared in constant time) and
// [offset, offset+length) lies inside the registration; otherwise the reader
// gets transport.ErrNotRegistered and no byte of memory is sent.
//
// # Wire protocol (versions 1 and 2)
//
// All integers are big-endian. A connection starts with an 8-byte hello in
// each direction; the reader sends its hello and may pipeline requests right
// behind it without waiting for the server's:
//
//	hello:    "CNXT" | version u8 | flags u8 (=0) | reserved u16 (=0)
//
// The reader's hello offers the highest version it speaks (2); the server
// answers with the version the connection speaks, the lower of the offer
// and its own. A server of version 1 (connexd before GATHER) closes a
// connection whose hello offers 2. A reader takes a close before the
// server's hello for a refusal when no hello from that address said 2 yet,
// or when it is the second in a row (a holder that speaks 2 closes one only
// when it sheds it: full, or restarting); it then offers 1 to that address
// for five minutes, and 2 again after. A reader sends GATHERs only to an
// address whose server's hello said 2; one planned before a refusal and due
// on a connection that offered 1 goes as its ranges' GETs.
//
// After the hello the reader sends request frames and the server answers
// every GET and GATHER, in order, with a response header followed by the
// payload when the status is OK:
//
//	request  (40 bytes): magic u8 (=0xC7) | op u8 | reserved u16 (=0)
//	                     | length u32 | request id u64 | key [16]byte | offset u64
//	segment  (16 bytes): offset u64 | length u32 | reserved u32 (=0)
//	response (16 bytes): magic u8 (=0xC7) | status u8 | reserved u16 (=0)
//	                     | payload length u32 | request id u64
//	                     then payload length bytes
//
//	op 1 GET:    read length bytes at offset of the registration named by key
//	op 2 CANCEL: the reader no longer wants request "request id"; length, key
//	             and offset are zero. Ignored if that request is not queued.
//	op 3 GATHER: (version 2) "offset" is a count n, 1 to MaxGatherSegments
//	             (64), and n segments follow the frame: read each range of
//	             the registration named by key, their bytes in a row;
//	             length is their sum. Every range must be registered (else
//	             status 1 for the whole request).
//	status 0 OK:             exactly the requested length follows
//	status 1 not registered: no payload (unknown id, wrong secret, out of range)
//	status 2 canceled:       no payload (answer to a canceled request)
//	status 3 fault:          no payload (the holder's memory faulted)
//
// Request ids are chosen by the reader and must be unique among its
// outstanding requests. A request longer than MaxRequestBytes (16 MiB); a
// bad magic, version, op or reserved field; an empty segment or segments
// that do not sum to the length; a GATHER on a version 1 connection; a
// reused id; or a response whose id is not outstanding or whose length
// disagrees with its request is a protocol error: the side that sees it
// logs a warning and closes that one connection. Frames are at most 1064
// bytes and the server reads at most 256 requests ahead, each decoded into
// at most 64 segments (~1 KiB): a connection's queued requests take at
// most ~270 KiB on the peer's say-so, held no longer than WriteTimeout when
// the peer stops reading its answers; MaxConnsPerPeer and MaxConns bound
// the connections.
//
// Readers split large GETs into Config.ChunkBytes requests, pack small ones
// (up to 32 KiB, a paged KV block's piece) of one registration into GATHERs
// of up to 1 MiB (gather.go), spread them over Config.ConnsPerEndpoint
// connections and keep at most Config.WindowBytes / Config.WindowOps in
// flight per Get call, refilling the window in batches.
// The server answers requests already queued with one writev straight from
// registered memory.
//
// # Failure semantics
//
// Get returns when every op completed, one failed, or its context (or the
// Endpoint) ended. When it gives up early it abandons its requests: it
// CANCELs those the server has not answered yet, and the reader discards
// the payloads that still arrive. If the reader is decoding a payload into
// the caller's memory at that moment, the Get kicks it (a read deadline in
// the past), and the reader acknowledges before Get returns; so Get returns
// within microseconds even if the peer is frozen, no byte lands in Dst after
// it returned, and the connection stays usable for the other Gets sharing it.
// A Get that ends by its context also cuts a connection that looks frozen
// (nothing received for a second, or thousands of abandoned requests), so a
// peer that wakes up does not stream a backlog nobody wants.
//
// A connection that receives nothing for Config.HedgeAfter (300 ms) while it
// carries a Get's requests is cut by that Get, and the requests are sent
// again on another connection, whose slot is redialed in the background:
// under packet loss one connection can sit in TCP's retransmission backoff
// for seconds while its siblings flow, longer than a pull's stall deadline.
// Each Get cuts at most ConnsPerEndpoint connections; against a frozen
// holder the resent requests go unanswered too and the Get still ends with
// its context.
//
// A connection that fails by EOF or reset fails its requests with
// transport.ErrPeerGone; Gets resend those requests once more on a fresh
// connection (GETs are idempotent, and an idle connection may have been
// dropped by the holder), so a dead holder surfaces as ErrPeerGone from the
// redial. A connection cut on behalf of another Get is retried the same
// way.
//
// Deregister waits until no server goroutine is writing from the memory. A
// write to a reader that does not drain its socket is aborted after
// Config.DeregisterGrace by closing that connection, so Deregister never waits
// on a frozen reader for long. Server writes to any reader are bounded by
// Config.WriteTimeout.
package tcp
