package ucx

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/connex/connex/transport"
)

// Config is the UCX backend's own configuration: the knobs OpenConfig takes
// besides the options every backend shares (transport.Options). The zero
// value is checked reads on UCX's safe default transports.
type Config struct {
	// TLS selects UCX transports ("tcp", "sm", "posix,sysv,self", ...),
	// overriding UCX_TLS for this Backend only. Empty keeps UCX_TLS from the
	// environment, or SafeDefaultTLS when that is unset.
	TLS string
	// ChunkBytes splits every GET larger than this into several; 0 means
	// DefaultChunkBytes, negative means never split.
	ChunkBytes int
	// Reads is how peers read memory this Backend Registers: ReadsChecked
	// (the default, also for "") or ReadsOneSided. It decides the kind of
	// remote key Register hands out; a reader follows the key, so Backends
	// in different modes interoperate. See the package documentation for
	// the tradeoff.
	Reads string
	// SharedReads is how this Backend, as a reader, reads shared keys
	// (memory a holder on this host got from Allocate) whose segment UCX
	// mapped here: SharedReadsMap (the default, also for "") or
	// SharedReadsGet.
	SharedReads string
	// ShmDir, if set, is the directory Allocate's shared memory goes to
	// (UCX's posix transport files: OpenConfig sets UCX_POSIX_DIR, for the
	// whole process, to it). A tmpfs mounted with huge=always there gives
	// the regions 2 MiB pages. Empty keeps UCX_POSIX_DIR, or /dev/shm.
	ShmDir string
}

// Shared-key read methods (Config.SharedReads).
const (
	// SharedReadsMap copies from UCX's mapping of the holder's segment
	// (ucp_rkey_ptr) on the calling goroutine and helpers, in parallel.
	SharedReadsMap = "map"
	// SharedReadsGet posts ucp_get_nbx on the owner thread, which UCX
	// serves with a memcpy from the same mapping, one GET at a time.
	SharedReadsGet = "get"
)

// Read modes (Config.Reads).
const (
	// ReadsChecked serves every GET of Register'ed memory through the
	// holder's checked request/reply protocol: revocable, bounds-checked by
	// the holder, two CPU copies.
	ReadsChecked = "checked"
	// ReadsOneSided maps Register'ed memory with ucp_mem_map and hands out
	// a real UCX rkey; readers post raw ucp_get_nbx, which on one host
	// goes over CMA (process_vm_readv by the reader, no holder CPU). Not
	// revocable: see the package documentation.
	ReadsOneSided = "onesided"
)

// OneSidedDefaultTLS is the transport list of a ReadsOneSided Backend when
// neither Config.TLS nor UCX_TLS is set. On one host the one-sided reads do
// not go through UCX at all (process_vm_readv, see the package
// documentation); UCX carries wire-up, GETs from checked holders, and the
// fallback when CMA is not permitted. TCP is the transport that allows
// UCP_ERR_HANDLING_MODE_PEER in UCX 1.13, so a dead peer fails the endpoint
// instead of hanging it. (cma would be allowed too, but UCX 1.13 uses it
// neither for ucp_get_nbx nor, with peer error handling, for anything else.)
const OneSidedDefaultTLS = "tcp,self"

func (c Config) sharedReads() (string, error) {
	switch strings.TrimSpace(c.SharedReads) {
	case "", SharedReadsMap:
		return SharedReadsMap, nil
	case SharedReadsGet:
		return SharedReadsGet, nil
	}
	return "", fmt.Errorf("ucx: shared_reads=%q, allowed: %s, %s", c.SharedReads, SharedReadsMap, SharedReadsGet)
}

func (c Config) reads() (string, error) {
	switch strings.TrimSpace(c.Reads) {
	case "", ReadsChecked:
		return ReadsChecked, nil
	case ReadsOneSided:
		return ReadsOneSided, nil
	}
	return "", fmt.Errorf("ucx: reads=%q, allowed: %s, %s", c.Reads, ReadsChecked, ReadsOneSided)
}

// SafeDefaultTLS is used when neither Config.TLS nor UCX_TLS is set: every
// transport except CMA and TCP, i.e. shared memory on one host and RDMA
// between hosts where the hardware exists. Both exclusions avoid UCX 1.13
// aborting the reader's process when its peer dies:
//   - with CMA, UCX moves large messages with process_vm_readv but calls
//     ucs_fatal when the holder dies mid-copy;
//   - with TCP lanes, a peer that dies while the endpoint's wire-up
//     messages are pending trips an assertion (ucp_request.c:684,
//     "req->send.wireup.type == ...") in ucp_ep_set_failed's pending purge;
//     seen in about 1 of 6 holder-SIGKILL e2e runs.
//
// Between hosts without RDMA, use connexd's TCP backend (backend=tcp), which
// is also faster than UCX over TCP here. Set TLS (or UCX_TLS) to opt back in.
const SafeDefaultTLS = "^cma,tcp"

// DefaultChunkBytes is the largest single GET the backend posts by default.
// Splitting a large range gives UCX several requests to pipeline (1 MiB
// measured best of 256 KiB .. 8 MiB here, with wide run-to-run variance).
const DefaultChunkBytes = 1 << 20

func (c Config) chunk() int {
	switch {
	case c.ChunkBytes == 0:
		return DefaultChunkBytes
	case c.ChunkBytes < 0:
		return 0
	default:
		return c.ChunkBytes
	}
}

// peerErrMode reports whether endpoints should ask UCX for peer error
// handling given the transport list tls: only when every transport named is
// TCP (plus "self"), because UCX 1.13 cannot combine peer error handling
// with its shared-memory transports (endpoint creation fails, or the default
// list silently drops to TCP only).
func peerErrMode(tls string) bool {
	tls = strings.TrimSpace(tls)
	if tls == "" || strings.HasPrefix(tls, "^") {
		return false
	}
	sawTCP := false
	for _, t := range strings.Split(tls, ",") {
		switch strings.TrimSpace(t) {
		case "tcp":
			sawTCP = true
		case "self", "cma", "":
		default:
			return false
		}
	}
	return sawTCP
}

// tlsHas reports whether the transport list tls names transport t
// explicitly (a "^" list excludes what it names).
func tlsHas(tls, t string) bool {
	tls = strings.TrimSpace(tls)
	if strings.HasPrefix(tls, "^") {
		return false
	}
	for _, x := range strings.Split(tls, ",") {
		if strings.TrimSpace(x) == t {
			return true
		}
	}
	return false
}

// posixNames are the UCX_TLS names that include the posix shared-memory
// transport, the one Allocate needs (its memory is a file another process
// can map): the transport itself and the aliases that cover it.
var posixNames = []string{"posix", "sm", "shm", "mm", "all"}

// allocates reports whether the transport list tls includes UCX's posix
// transport: UCX's defaults (""), a "^" list that does not exclude it, or a
// list that names it.
func allocates(tls string) bool {
	tls = strings.TrimSpace(tls)
	if tls == "" {
		return true
	}
	exclude := strings.HasPrefix(tls, "^")
	for _, x := range strings.Split(strings.TrimPrefix(tls, "^"), ",") {
		if slices.Contains(posixNames, strings.TrimSpace(x)) {
			return !exclude
		}
	}
	return exclude
}

// Packed formats. Both carry a magic so that bytes meant for another backend
// (a TCP host:port, a truncated key) are rejected before UCX parses them:
// UCX trusts its own packed formats and would read past garbage.
//
//	key:  "cxk1" | base u64 | len u64 | kind u8 | kind-specific
//	      kind 1 (checked): registration id u64 | token u64
//	      kind 2 (rma):     UCX packed rkey (Alloc)
//	      kind 3 (onesided): pid u32 | start time u64 | host id [16] | UCX packed rkey
//	      kind 4 (shared):  registration id u64 | token u64 | allocation id u64 |
//	                        pid u32 | start time u64 | host id [16] | UCX packed rkey
//	addr: "cxa1" | UCX packed worker address
const (
	keyMagic  = "cxk1"
	addrMagic = "cxa1"
	keyHdr    = 4 + 8 + 8 + 1

	keyChecked  = 1 // GET by request/reply; the holder checks every request
	keyRMA      = 2 // raw ucp_get_nbx on UCX-allocated memory; not revocable
	keyOneSided = 3 // Register in onesided mode: CMA on one host, else raw ucp_get_nbx; not revocable
	keyShared   = 4 // memory from Allocate: raw GET where mapped (one host), else checked

	oneSidedHdr = 4 + 8 + 16
	sharedHdr   = 8 + 8 + 8 + oneSidedHdr
)

// procID names a process for CMA: its pid, its start time (clock ticks since
// boot, /proc/<pid>/stat field 22, so a reused pid is told apart) and a host
// id (hash of the kernel boot id and the pid namespace): CMA is used only
// when the reader's host id is the same.
type procID struct {
	pid   uint32
	start uint64
	host  [16]byte
}

// remoteKey is a parsed packed key.
type remoteKey struct {
	base, n    uint64
	kind       byte
	reg, token uint64 // keyChecked, keyShared
	rkey       []byte // keyRMA, keyOneSided, keyShared
	proc       procID // keyOneSided, keyShared
	alloc      uint64 // keyShared: the allocation's id
}

// sharedCacheKey is what a reader caches a shared key's unpacked rkey
// under: the allocation id and the rkey. The id matters: a freed
// allocation's address and file descriptor are soon reused, and UCX's rkey
// bytes for the new one can be identical while the old mapping is stale.
func (k *remoteKey) sharedCacheKey() string {
	var id [8]byte
	binary.LittleEndian.PutUint64(id[:], k.alloc)
	return string(id[:]) + string(k.rkey)
}

func packCheckedKey(base uint64, n int, reg, token uint64) []byte {
	b := keyHeader(base, n, keyChecked, 16)
	binary.LittleEndian.PutUint64(b[keyHdr:], reg)
	binary.LittleEndian.PutUint64(b[keyHdr+8:], token)
	return b
}

func packRMAKey(base uint64, n int, rkey []byte) []byte {
	b := keyHeader(base, n, keyRMA, len(rkey))
	copy(b[keyHdr:], rkey)
	return b
}

func packOneSidedKey(base uint64, n int, p procID, rkey []byte) []byte {
	b := keyHeader(base, n, keyOneSided, oneSidedHdr+len(rkey))
	binary.LittleEndian.PutUint32(b[keyHdr:], p.pid)
	binary.LittleEndian.PutUint64(b[keyHdr+4:], p.start)
	copy(b[keyHdr+12:], p.host[:])
	copy(b[keyHdr+oneSidedHdr:], rkey)
	return b
}

func packSharedKey(base uint64, n int, reg, token, alloc uint64, p procID, rkey []byte) []byte {
	b := keyHeader(base, n, keyShared, sharedHdr+len(rkey))
	binary.LittleEndian.PutUint64(b[keyHdr:], reg)
	binary.LittleEndian.PutUint64(b[keyHdr+8:], token)
	binary.LittleEndian.PutUint64(b[keyHdr+16:], alloc)
	binary.LittleEndian.PutUint32(b[keyHdr+24:], p.pid)
	binary.LittleEndian.PutUint64(b[keyHdr+28:], p.start)
	copy(b[keyHdr+36:], p.host[:])
	copy(b[keyHdr+sharedHdr:], rkey)
	return b
}

func keyHeader(base uint64, n int, kind byte, extra int) []byte {
	b := make([]byte, keyHdr+extra)
	copy(b, keyMagic)
	binary.LittleEndian.PutUint64(b[4:], base)
	binary.LittleEndian.PutUint64(b[12:], uint64(n))
	b[20] = kind
	return b
}

// parseKey decodes a packed key.
func parseKey(k []byte) (remoteKey, error) {
	var rk remoteKey
	if len(k) < keyHdr || string(k[:4]) != keyMagic {
		return rk, fmt.Errorf("%w: not a ucx key (%d bytes)", transport.ErrBadKey, len(k))
	}
	rk.base = binary.LittleEndian.Uint64(k[4:])
	rk.n = binary.LittleEndian.Uint64(k[12:])
	rk.kind = k[20]
	if rk.base+rk.n < rk.base {
		return rk, fmt.Errorf("%w: extent overflows", transport.ErrBadKey)
	}
	rest := k[keyHdr:]
	switch {
	case rk.kind == keyChecked && len(rest) == 16:
		rk.reg = binary.LittleEndian.Uint64(rest)
		rk.token = binary.LittleEndian.Uint64(rest[8:])
		if rk.reg == 0 {
			return rk, fmt.Errorf("%w: zero registration id", transport.ErrBadKey)
		}
	case rk.kind == keyRMA && len(rest) > 0:
		rk.rkey = rest
	case rk.kind == keyOneSided && len(rest) > oneSidedHdr:
		rk.proc.pid = binary.LittleEndian.Uint32(rest)
		rk.proc.start = binary.LittleEndian.Uint64(rest[4:])
		copy(rk.proc.host[:], rest[12:oneSidedHdr])
		rk.rkey = rest[oneSidedHdr:]
		if rk.proc.pid == 0 {
			return rk, fmt.Errorf("%w: zero pid", transport.ErrBadKey)
		}
	case rk.kind == keyShared && len(rest) > sharedHdr:
		rk.reg = binary.LittleEndian.Uint64(rest)
		rk.token = binary.LittleEndian.Uint64(rest[8:])
		rk.alloc = binary.LittleEndian.Uint64(rest[16:])
		rk.proc.pid = binary.LittleEndian.Uint32(rest[24:])
		rk.proc.start = binary.LittleEndian.Uint64(rest[28:])
		copy(rk.proc.host[:], rest[36:sharedHdr])
		rk.rkey = rest[sharedHdr:]
		if rk.reg == 0 || rk.proc.pid == 0 {
			return rk, fmt.Errorf("%w: zero registration id or pid", transport.ErrBadKey)
		}
	default:
		return rk, fmt.Errorf("%w: bad kind %d or length %d", transport.ErrBadKey, rk.kind, len(k))
	}
	return rk, nil
}

func packAddr(ucx []byte) []byte {
	return append([]byte(addrMagic), ucx...)
}

func parseAddr(a []byte) ([]byte, error) {
	if len(a) <= len(addrMagic) || string(a[:len(addrMagic)]) != addrMagic {
		return nil, fmt.Errorf("%w: not a ucx worker address (%d bytes)", transport.ErrPeerGone, len(a))
	}
	return a[len(addrMagic):], nil
}

// ucs_status_t values (ucs/type/status.h) that map to a sentinel.
const (
	ucsErrIOError         = -3
	ucsErrInvalidParam    = -5
	ucsErrUnreachable     = -6
	ucsErrInvalidAddr     = -7
	ucsErrNoElem          = -12 // the holder refused: no such registration or range
	ucsErrCanceled        = -16
	ucsErrShmemSegment    = -17
	ucsErrTimedOut        = -20
	ucsErrRejected        = -23
	ucsErrNotConnected    = -24
	ucsErrConnectionReset = -25
	ucsErrFirstLink       = -40
	ucsErrLastLink        = -59
	ucsErrFirstEndpoint   = -60
	ucsErrLastEndpoint    = -89
	// cxErrFault is faultguard.h's CX_ERR_FAULT: a holder refused a
	// checked GET because its memory faulted.
	cxErrFault = -101
)

// sentinelFor maps a ucs_status_t to the transport sentinel it means, or nil
// when none fits (the error then carries only UCX's text).
func sentinelFor(code int) error {
	switch {
	case code == cxErrFault:
		return transport.ErrFault
	case code == ucsErrCanceled:
		return transport.ErrCanceled
	case code == ucsErrNoElem:
		return transport.ErrNotRegistered
	case code == ucsErrUnreachable, code == ucsErrInvalidAddr, code == ucsErrShmemSegment,
		code == ucsErrTimedOut, code == ucsErrRejected, code == ucsErrNotConnected,
		code == ucsErrConnectionReset, code == ucsErrIOError:
		return transport.ErrPeerGone
	case code <= ucsErrFirstLink && code >= ucsErrLastLink,
		code <= ucsErrFirstEndpoint && code >= ucsErrLastEndpoint:
		return transport.ErrPeerGone
	}
	return nil
}

// StatusError is a UCX failure. It unwraps to the transport sentinel its
// status means (errors.Is(err, transport.ErrPeerGone)), never to a UCX type.
type StatusError struct {
	Op     string // the libucp call or stage that failed
	Code   int    // the ucs_status_t value
	Status string // UCX's text for it
}

// Error names the operation, UCX's status text and its code.
func (e *StatusError) Error() string {
	return fmt.Sprintf("ucx: %s: %s (%d)", e.Op, e.Status, e.Code)
}

// Unwrap returns the transport sentinel for the status, if any.
func (e *StatusError) Unwrap() error { return sentinelFor(e.Code) }

var errNoUCX = fmt.Errorf("%w: connex built without UCX (build with -tags ucx and cgo)", transport.ErrUnavailable)
