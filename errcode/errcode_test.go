package errcode

import (
	"errors"
	"fmt"
	"testing"

	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/lease"
	"github.com/connex/connex/requests"
	"github.com/connex/connex/transport"
)

func TestOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want api.Code
	}{
		{nil, 0},
		{lease.ErrExpired, api.CodeExpired},
		{fmt.Errorf("hold t: %w", lease.ErrReleased), api.CodeReleased},
		{lease.ErrStaleBinding, api.CodeNotYours},
		{lease.ErrDuplicate, api.CodeBadRequest},
		{fmt.Errorf("request r: %w", requests.ErrFenced), api.CodeFenced},
		{requests.ErrNotFound, api.CodeUnknownRequest},
		{requests.ErrStoreFull, api.CodeOverloaded},
		{kvmem.ErrBadBlockIDs, api.CodeBadBlockIDs},
		{kvmem.ErrOutsideRegionDir, api.CodeForbidden},
		{kvmem.ErrRegionBroken, api.CodeRegionBroken},
		{transport.ErrFault, api.CodeRegionBroken},
		{transport.ErrTimeout, api.CodeTimeout},
		{transport.ErrPeerGone, api.CodePeerUnavailable},
		{transport.ErrBadKey, api.CodeTransferFailed},
		{api.Errorf(api.CodeOverloaded, "x"), api.CodeOverloaded},
		{errors.New("something else"), api.CodeInternal},
	} {
		if got := Of(tc.err); got != tc.want {
			t.Errorf("Of(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
	// The wire package alone knows only its own errors.
	if got := api.CodeOf(lease.ErrExpired); got != api.CodeInternal {
		t.Fatalf("api.CodeOf of a lease error: %d, want internal", got)
	}
	e := AsError(fmt.Errorf("pull p: %w", transport.ErrTimeout))
	if e.Code != api.CodeTimeout || e.Msg != "pull p: "+transport.ErrTimeout.Error() {
		t.Fatalf("AsError: %+v", e)
	}
	own := api.Errorf(api.CodeFenced, "moved")
	if AsError(fmt.Errorf("wrapped: %w", own)) != own {
		t.Fatal("AsError must return an *api.Error in the chain as it is")
	}
}
