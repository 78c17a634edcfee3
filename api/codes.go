package api

import (
	"errors"
	"fmt"

	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/lease"
	"github.com/connex/connex/requests"
	"github.com/connex/connex/transport"
)

// Code is a stable numeric error code sent in the Nats-Service-Error-Code
// header. Codes never change meaning; new failures get new codes.
type Code int

// The error table. Engine shims branch on these numbers.
const (
	CodeMalformed       Code = 400 // payload is not a valid message for the endpoint
	CodeBadContentType  Code = 401 // Content-Type is neither application/protobuf nor application/json
	CodeNotYours        Code = 403 // the requester may not act on this transfer
	CodeUnknownTransfer Code = 404 // no such transfer (never existed or long forgotten)
	CodeUnknownRegion   Code = 405 // no such engine region registered here
	CodeForbidden       Code = 406 // a region file outside region_dir, through a link, or not owned by an allowed user
	CodeReleased        Code = 409 // transfer already released (or freed after its pull)
	CodeExpired         Code = 410 // transfer's lease expired and its blocks were freed
	CodeTooLarge        Code = 413 // payload larger than max_request_bytes
	CodeBadBlockIDs     Code = 422 // block ids empty, out of range, duplicated, or count mismatch
	CodeBadLayout       Code = 423 // layout invalid or disagrees with the region file
	CodeIncompatible    Code = 424 // layouts of the two sides differ (TP size, block size, …)
	CodeBlocksBusy      Code = 425 // destination blocks are being written by another pull
	CodeEngineGone      Code = 426 // the engine that owned the transfer went away
	CodeBadRequest      Code = 427 // a required field is missing or a value is out of range
	CodeFenced          Code = 428 // the request moved to another owner (stale epoch); stop acting on it
	CodeUnknownRequest  Code = 430 // no such in-flight request
	CodeRequestExists   Code = 431 // a request with that id is already running
	CodeOverloaded      Code = 429 // too many requests in flight; retry later
	CodeInternal        Code = 500 // a bug; the log says more
	CodeRegionIO        Code = 507 // the region file could not be opened or mapped
	CodePeerUnavailable Code = 503 // the holding member or its data plane cannot be reached
	CodeTimeout         Code = 504 // the operation ran past its deadline
	CodeTransferFailed  Code = 502 // the data plane failed during a pull
)

// codeNames gives every code a stable name for logs and docs.
var codeNames = map[Code]string{
	CodeMalformed: "malformed_payload", CodeBadContentType: "bad_content_type", CodeNotYours: "not_yours",
	CodeUnknownTransfer: "unknown_transfer", CodeUnknownRegion: "unknown_region", CodeForbidden: "forbidden", CodeReleased: "released",
	CodeExpired: "expired", CodeTooLarge: "payload_too_large", CodeBadBlockIDs: "bad_block_ids",
	CodeBadLayout: "bad_layout", CodeIncompatible: "incompatible", CodeBlocksBusy: "blocks_busy",
	CodeEngineGone: "engine_gone", CodeBadRequest: "bad_request", CodeFenced: "fenced",
	CodeUnknownRequest: "unknown_request", CodeRequestExists: "request_exists", CodeOverloaded: "overloaded",
	CodeInternal: "internal", CodeRegionIO: "region_io", CodePeerUnavailable: "peer_unavailable",
	CodeTimeout: "timeout", CodeTransferFailed: "transfer_failed",
}

// Name is the code's stable name, e.g. "expired".
func (c Code) Name() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("code_%d", int(c))
}

// Error is an API failure with its stable code. Handlers return it; clients
// decode it from the reply headers.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string { return fmt.Sprintf("%s (%d): %s", e.Code.Name(), int(e.Code), e.Msg) }

// Errorf builds an *Error.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// CodeOf maps any error to its API code: an *Error keeps its code; the
// sentinels of lease, kvmem and transport map to theirs; the rest is internal.
func CodeOf(err error) Code {
	var ae *Error
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ae):
		return ae.Code
	case errors.Is(err, lease.ErrExpired):
		return CodeExpired
	case errors.Is(err, lease.ErrReleased):
		return CodeReleased
	case errors.Is(err, lease.ErrNotYours), errors.Is(err, lease.ErrStaleBinding):
		return CodeNotYours
	case errors.Is(err, lease.ErrEngineGone):
		return CodeEngineGone
	case errors.Is(err, lease.ErrBadConfig), errors.Is(err, lease.ErrDuplicate), errors.Is(err, lease.ErrUnknownPull):
		return CodeBadRequest
	case errors.Is(err, requests.ErrFenced), errors.Is(err, requests.ErrNotOrphan):
		return CodeFenced
	case errors.Is(err, requests.ErrNotFound):
		return CodeUnknownRequest
	case errors.Is(err, requests.ErrExists):
		return CodeRequestExists
	case errors.Is(err, requests.ErrInvalid):
		return CodeBadRequest
	case errors.Is(err, kvmem.ErrBadBlockIDs):
		return CodeBadBlockIDs
	case errors.Is(err, kvmem.ErrOutsideRegionDir):
		return CodeForbidden
	case errors.Is(err, kvmem.ErrOverQuota), errors.Is(err, requests.ErrStoreFull):
		return CodeOverloaded
	case errors.Is(err, kvmem.ErrBadLayout):
		return CodeBadLayout
	case errors.Is(err, kvmem.ErrIncompatible):
		return CodeIncompatible
	case errors.Is(err, kvmem.ErrBlocksBusy):
		return CodeBlocksBusy
	case errors.Is(err, kvmem.ErrRegion):
		return CodeRegionIO
	case errors.Is(err, transport.ErrTimeout):
		return CodeTimeout
	case errors.Is(err, transport.ErrPeerGone), errors.Is(err, transport.ErrUnavailable):
		return CodePeerUnavailable
	case errors.Is(err, transport.ErrNotRegistered), errors.Is(err, transport.ErrBadKey), errors.Is(err, transport.ErrCanceled), errors.Is(err, transport.ErrClosed):
		return CodeTransferFailed
	}
	return CodeInternal
}

// AsError converts any error into an *Error with the mapped code.
func AsError(err error) *Error {
	var ae *Error
	if errors.As(err, &ae) {
		return ae
	}
	return &Error{Code: CodeOf(err), Msg: err.Error()}
}
