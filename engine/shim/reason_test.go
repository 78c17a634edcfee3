package shim

import (
	"context"
	"fmt"
	"testing"

	"github.com/connex/connex/api"
	"github.com/nats-io/nats.go"
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

// A pull.start that failed without an answer from connexd (a timeout, the
// NATS link down) may still run there: the shim waits for its pull.done
// before it gives dst back. Only an answered refusal, or no connexd at all,
// started nothing.
func TestPullStartRefusedOnlyWhenAnswered(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"answered refusal", api.Errorf(api.CodeUnknownTransfer, "no such hold"), true},
		{"no connexd", &api.Error{Code: api.CodePeerUnavailable, Msg: "x", Cause: nats.ErrNoResponders}, true},
		{"answered peer_unavailable", api.Errorf(api.CodePeerUnavailable, "the holder is not reachable"), true},
		{"timeout", api.Errorf(api.CodeTimeout, "no reply"), false},
		{"link down", &api.Error{Code: api.CodePeerUnavailable, Msg: "x", Cause: nats.ErrConnectionReconnecting}, false},
		{"connection closed", fmt.Errorf("api: pull.start: %w", nats.ErrConnectionClosed), false},
		{"ctx canceled", fmt.Errorf("api: pull.start: %w", context.Canceled), false},
	} {
		if got := refused(c.err); got != c.want {
			t.Errorf("%s: refused = %v, want %v", c.name, got, c.want)
		}
	}
}
