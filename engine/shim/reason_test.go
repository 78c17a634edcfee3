package shim

import (
	"testing"

	"github.com/connex/connex/api"
)

// TestReasonReadsAsTheTableSays: a load failure reads as api/codes.json's
// reason where it gives one, else as the code's name, and an unknown code
// as connexd names it (connex_vllm.codes.reason says the same).
func TestReasonReadsAsTheTableSays(t *testing.T) {
	for c, want := range map[api.Code]string{
		api.CodeExpired:         "expired",
		api.CodePeerUnavailable: "holder unavailable",
		api.CodeEngineGone:      "holder unavailable",
		api.CodeBadLayout:       "incompatible",
		api.CodeUnknownRegion:   "unknown_region",
		api.CodeTransferFailed:  "transfer_failed",
		599:                     "code_599",
	} {
		if got := Reason(c); got != want {
			t.Errorf("Reason(%d) = %q, want %q", c, got, want)
		}
	}
}
