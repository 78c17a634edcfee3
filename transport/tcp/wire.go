package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/connex/connex/transport"
)

// Wire constants of protocol version 1; doc.go describes the frames.
const (
	// ProtocolVersion is the wire version this package speaks.
	ProtocolVersion = 1
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

// appendHello appends this side's hello to b.
func appendHello(b []byte) []byte {
	b = append(b, helloMagic[:]...)
	return append(b, ProtocolVersion, 0, 0, 0)
}

// decodeHello checks a peer's hello.
func decodeHello(b []byte) error {
	if len(b) != helloLen {
		return protoErr("hello is %d bytes, want %d", len(b), helloLen)
	}
	if [4]byte(b[:4]) != helloMagic {
		return protoErr("bad hello magic %q", b[:4])
	}
	if b[4] != ProtocolVersion {
		return protoErr("unsupported protocol version %d (want %d)", b[4], ProtocolVersion)
	}
	if b[5] != 0 || b[6] != 0 || b[7] != 0 {
		return protoErr("nonzero hello flags %x", b[5:8])
	}
	return nil
}

// request is a decoded request frame: a GET, or a CANCEL of the GET with
// the same id.
type request struct {
	op     uint8
	id     uint64
	key    remoteKey
	offset uint64
	length uint32
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
	if b[1] != opGet && b[1] != opCancel {
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
