package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/connex/connex/transport"
)

// Wire constants of protocol versions 1 and 2; doc.go describes the frames.
const (
	// ProtocolVersion is the highest wire version this package speaks. A
	// reader offers it in its hello; the holder answers with the version
	// the connection then speaks (the lower of the two), and a reader whose
	// offer a holder of version 1 refused (it closes the connection) offers
	// 1 to that address from then on. Version 2 adds GATHER.
	ProtocolVersion = 2
	// minProtocolVersion is the oldest version still spoken.
	minProtocolVersion = 1
	// gatherVersion is the first version with GATHER requests.
	gatherVersion = 2
	// MaxRequestBytes is the largest payload one request may ask for.
	// Larger GETs are split by the reader.
	MaxRequestBytes = 16 << 20
	// KeyLen is the length of a packed remote key: id + secret.
	KeyLen = 16

	helloLen    = 8
	requestLen  = 40
	responseLen = 16
	frameMagic  = 0xC7
	opGet       = 1
	opCancel    = 2
	opGather    = 3
	segmentLen  = 16
	// MaxGatherSegments is the most ranges one GATHER request reads.
	MaxGatherSegments = 64
)

// Response status codes. They are stable: never renumber.
const (
	statusOK            = 0
	statusNotRegistered = 1
	statusCanceled      = 2
	// statusFault: the holder's memory faulted when it touched the range
	// (its region file shrank); no payload.
	statusFault = 3
)

var helloMagic = [4]byte{'C', 'N', 'X', 'T'}

// errProtocol marks a malformed frame; the connection that carried it is
// closed.
var errProtocol = errors.New("tcp: protocol error")

// protoErr wraps errProtocol with what exactly was wrong.
func protoErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errProtocol, fmt.Sprintf(format, args...))
}

// remoteKey is a decoded remote key.
type remoteKey struct {
	id     uint64
	secret [8]byte
}

// encodeKey packs k into its 16-byte wire form.
func encodeKey(k remoteKey) []byte {
	b := make([]byte, KeyLen)
	binary.BigEndian.PutUint64(b, k.id)
	copy(b[8:], k.secret[:])
	return b
}

// decodeKey unpacks a remote key handed out by Registration.RemoteKey.
func decodeKey(b []byte) (remoteKey, error) {
	if len(b) != KeyLen {
		return remoteKey{}, fmt.Errorf("%w: tcp key is %d bytes, want %d", transport.ErrBadKey, len(b), KeyLen)
	}
	var k remoteKey
	k.id = binary.BigEndian.Uint64(b)
	copy(k.secret[:], b[8:])
	if k.id == 0 {
		return remoteKey{}, fmt.Errorf("%w: tcp key has id 0", transport.ErrBadKey)
	}
	return k, nil
}

// appendHello appends a hello of the given version to b.
func appendHello(b []byte, version uint8) []byte {
	b = append(b, helloMagic[:]...)
	return append(b, version, 0, 0, 0)
}

// decodeHello checks a peer's hello and returns its version: any version a
// peer may offer (a newer reader offers more than ProtocolVersion; the
// server answers with the lower of the two, and a reader checks that the
// answer is no more than its offer).
func decodeHello(b []byte) (uint8, error) {
	if len(b) != helloLen {
		return 0, protoErr("hello is %d bytes, want %d", len(b), helloLen)
	}
	if [4]byte(b[:4]) != helloMagic {
		return 0, protoErr("bad hello magic %q", b[:4])
	}
	if b[4] < minProtocolVersion {
		return 0, protoErr("unsupported protocol version %d (want %d or later)", b[4], minProtocolVersion)
	}
	if b[5] != 0 || b[6] != 0 || b[7] != 0 {
		return 0, protoErr("nonzero hello flags %x", b[5:8])
	}
	return b[4], nil
}

// request is a decoded request frame: a GET, a GATHER (segs), or a CANCEL
// of the request with the same id.
type request struct {
	op     uint8
	id     uint64
	key    remoteKey
	offset uint64
	length uint32
	segs   []segment // GATHER: the ranges read, in payload order
}

// segment is one range of a GATHER request.
type segment struct {
	offset uint64
	length uint32
}

// appendGather appends the wire form of the GATHER r (r.segs, r.length
// their sum) to b.
func appendGather(b []byte, r request) []byte {
	b = append(b, frameMagic, opGather, 0, 0)
	b = binary.BigEndian.AppendUint32(b, r.length)
	b = binary.BigEndian.AppendUint64(b, r.id)
	b = binary.BigEndian.AppendUint64(b, r.key.id)
	b = append(b, r.key.secret[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(len(r.segs)))
	for _, s := range r.segs {
		b = binary.BigEndian.AppendUint64(b, s.offset)
		b = binary.BigEndian.AppendUint32(b, s.length)
		b = append(b, 0, 0, 0, 0)
	}
	return b
}

// gatherSegments is how many segments follow the GATHER frame header b
// (a valid request header: decodeRequest), so the caller can read them.
func gatherSegments(b []byte) int {
	return int(binary.BigEndian.Uint64(b[32:]))
}

// decodeSegments parses and checks a GATHER's segments (n of them, their
// lengths summing to r.length) into r.segs.
func decodeSegments(r *request, b []byte) error {
	n := len(b) / segmentLen
	if len(b) != n*segmentLen || uint64(n) != r.offset {
		return protoErr("gather of %d segments carries %d segment bytes", r.offset, len(b))
	}
	r.segs = make([]segment, n)
	var sum uint64
	for i := range r.segs {
		s := b[i*segmentLen:]
		if s[12] != 0 || s[13] != 0 || s[14] != 0 || s[15] != 0 {
			return protoErr("nonzero gather segment reserved field")
		}
		r.segs[i] = segment{offset: binary.BigEndian.Uint64(s), length: binary.BigEndian.Uint32(s[8:])}
		if r.segs[i].length == 0 {
			return protoErr("empty gather segment")
		}
		sum += uint64(r.segs[i].length)
	}
	if sum != uint64(r.length) {
		return protoErr("gather segments sum to %d bytes, request says %d", sum, r.length)
	}
	r.offset = 0
	return nil
}

// appendRequest appends the wire form of the GET r to b.
func appendRequest(b []byte, r request) []byte {
	b = append(b, frameMagic, opGet, 0, 0)
	b = binary.BigEndian.AppendUint32(b, r.length)
	b = binary.BigEndian.AppendUint64(b, r.id)
	b = binary.BigEndian.AppendUint64(b, r.key.id)
	b = append(b, r.key.secret[:]...)
	return binary.BigEndian.AppendUint64(b, r.offset)
}

// appendCancel appends a CANCEL of request id to b.
func appendCancel(b []byte, id uint64) []byte {
	b = append(b, frameMagic, opCancel, 0, 0, 0, 0, 0, 0)
	b = binary.BigEndian.AppendUint64(b, id)
	return append(b, make([]byte, requestLen-16)...)
}

// decodeRequest parses and validates one request frame.
func decodeRequest(b []byte) (request, error) {
	if len(b) != requestLen {
		return request{}, protoErr("request is %d bytes, want %d", len(b), requestLen)
	}
	if b[0] != frameMagic {
		return request{}, protoErr("bad request magic %#x", b[0])
	}
	if b[1] != opGet && b[1] != opCancel && b[1] != opGather {
		return request{}, protoErr("unknown op %d", b[1])
	}
	if b[2] != 0 || b[3] != 0 {
		return request{}, protoErr("nonzero request reserved field")
	}
	r := request{
		op:     b[1],
		length: binary.BigEndian.Uint32(b[4:]),
		id:     binary.BigEndian.Uint64(b[8:]),
		offset: binary.BigEndian.Uint64(b[32:]),
	}
	r.key.id = binary.BigEndian.Uint64(b[16:])
	copy(r.key.secret[:], b[24:32])
	if r.length > MaxRequestBytes {
		return request{}, protoErr("request length %d exceeds %d", r.length, MaxRequestBytes)
	}
	if r.op == opCancel && (r.length != 0 || r.offset != 0 || r.key != (remoteKey{})) {
		return request{}, protoErr("cancel frame with nonzero fields")
	}
	if r.op == opGather && (r.offset == 0 || r.offset > MaxGatherSegments) {
		return request{}, protoErr("gather of %d segments (want 1 to %d)", r.offset, MaxGatherSegments)
	}
	return r, nil
}

// response is a decoded response header; the payload follows it.
type response struct {
	id     uint64
	status uint8
	length uint32
}

// putResponse writes the wire form of r into b, which must hold responseLen
// bytes.
func putResponse(b []byte, r response) {
	b[0], b[1], b[2], b[3] = frameMagic, r.status, 0, 0
	binary.BigEndian.PutUint32(b[4:], r.length)
	binary.BigEndian.PutUint64(b[8:], r.id)
}

// decodeResponse parses and validates one response header on its own; the
// reader also checks it against the outstanding request (checkResponse).
func decodeResponse(b []byte) (response, error) {
	if len(b) != responseLen {
		return response{}, protoErr("response is %d bytes, want %d", len(b), responseLen)
	}
	if b[0] != frameMagic {
		return response{}, protoErr("bad response magic %#x", b[0])
	}
	if b[2] != 0 || b[3] != 0 {
		return response{}, protoErr("nonzero response reserved field")
	}
	r := response{
		status: b[1],
		length: binary.BigEndian.Uint32(b[4:]),
		id:     binary.BigEndian.Uint64(b[8:]),
	}
	switch r.status {
	case statusOK:
		if r.length > MaxRequestBytes {
			return response{}, protoErr("response length %d exceeds %d", r.length, MaxRequestBytes)
		}
	case statusNotRegistered, statusCanceled, statusFault:
		if r.length != 0 {
			return response{}, protoErr("error response carries %d payload bytes", r.length)
		}
	default:
		return response{}, protoErr("unknown status %d", r.status)
	}
	return r, nil
}

// checkResponse verifies that r answers a request for want bytes.
func checkResponse(r response, want uint32) error {
	if r.status == statusOK && r.length != want {
		return protoErr("response %d carries %d bytes, request asked for %d", r.id, r.length, want)
	}
	return nil
}
