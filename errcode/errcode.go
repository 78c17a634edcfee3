// Package errcode maps the errors of Connex's domain packages (lease,
// kvmem, requests, transport) to the subject API's stable codes. It is the
// one package that knows both sides: the wire package (api) imports none of
// the domain packages, and they import nothing of the wire. connexd serves
// its API with AsError (api.ServeOptions.Errors); code that acts on a
// domain error's code (a puller filling PullDone) asks Of.
package errcode

import (
	"errors"

	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/lease"
	"github.com/connex/connex/requests"
	"github.com/connex/connex/transport"
)

// Of maps err to its API code: an *api.Error keeps its code; the sentinels
// of lease, kvmem, requests and transport map to theirs; anything else is
// api.CodeInternal (0 for nil).
func Of(err error) api.Code {
	var ae *api.Error
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ae):
		return ae.Code
	case errors.Is(err, lease.ErrExpired):
		return api.CodeExpired
	case errors.Is(err, lease.ErrReleased):
		return api.CodeReleased
	case errors.Is(err, lease.ErrNotYours), errors.Is(err, lease.ErrStaleBinding):
		return api.CodeNotYours
	case errors.Is(err, lease.ErrEngineGone):
		return api.CodeEngineGone
	case errors.Is(err, lease.ErrBadConfig), errors.Is(err, lease.ErrDuplicate), errors.Is(err, lease.ErrUnknownPull):
		return api.CodeBadRequest
	case errors.Is(err, requests.ErrFenced), errors.Is(err, requests.ErrNotOrphan):
		return api.CodeFenced
	case errors.Is(err, requests.ErrNotFound):
		return api.CodeUnknownRequest
	case errors.Is(err, requests.ErrExists):
		return api.CodeRequestExists
	case errors.Is(err, requests.ErrInvalid):
		return api.CodeBadRequest
	case errors.Is(err, kvmem.ErrBadBlockIDs):
		return api.CodeBadBlockIDs
	case errors.Is(err, kvmem.ErrOutsideRegionDir):
		return api.CodeForbidden
	case errors.Is(err, kvmem.ErrOverQuota), errors.Is(err, requests.ErrStoreFull), errors.Is(err, requests.ErrQuota):
		return api.CodeOverloaded
	case errors.Is(err, kvmem.ErrBadLayout):
		return api.CodeBadLayout
	case errors.Is(err, kvmem.ErrIncompatible):
		return api.CodeIncompatible
	case errors.Is(err, kvmem.ErrBlocksBusy):
		return api.CodeBlocksBusy
	case errors.Is(err, kvmem.ErrRegion):
		return api.CodeRegionIO
	case errors.Is(err, kvmem.ErrRegionBroken), errors.Is(err, transport.ErrFault):
		return api.CodeRegionBroken
	case errors.Is(err, transport.ErrTimeout):
		return api.CodeTimeout
	case errors.Is(err, transport.ErrPeerGone), errors.Is(err, transport.ErrUnavailable):
		return api.CodePeerUnavailable
	case errors.Is(err, transport.ErrNotRegistered), errors.Is(err, transport.ErrBadKey), errors.Is(err, transport.ErrCanceled), errors.Is(err, transport.ErrClosed):
		return api.CodeTransferFailed
	}
	return api.CodeInternal
}

// AsError converts err into the *api.Error a caller gets: an *api.Error as
// it is, anything else with Of's code and its message.
func AsError(err error) *api.Error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae
	}
	return &api.Error{Code: Of(err), Msg: err.Error()}
}
