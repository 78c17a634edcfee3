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

//go:generate go run ./gencodes

// The constants and names of the error table are generated from
// codes.json (codes_gen.go), which also writes README.md's table.

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
	// Cause is the error behind a code the client itself decided (NATS'
	// "no responders", a timeout), for errors.Is; nil for a code the member
	// answered with.
	Cause error
}

func (e *Error) Error() string { return fmt.Sprintf("%s (%d): %s", e.Code.Name(), int(e.Code), e.Msg) }

// Unwrap returns Cause.
func (e *Error) Unwrap() error { return e.Cause }

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
	case errors.Is(err, kvmem.ErrRegionBroken), errors.Is(err, transport.ErrFault):
		return CodeRegionBroken
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
