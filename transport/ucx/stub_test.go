//go:build !ucx || !cgo

package ucx

import (
	"errors"
	"testing"

	"github.com/connex/connex/transport"
)

func TestStubUnavailable(t *testing.T) {
	if Available() {
		t.Fatal("stub reports UCX available")
	}
	if _, err := Open(transport.Options{}); !errors.Is(err, transport.ErrUnavailable) {
		t.Fatalf("Open: %v, want ErrUnavailable", err)
	}
}

// TestStubCaps: a binary without UCX claims no capability, so no caller
// takes a path the stub cannot serve.
func TestStubCaps(t *testing.T) {
	if got := (&Backend{}).Caps(); got != (transport.Caps{}) {
		t.Fatalf("stub Caps = %+v, want none", got)
	}
}
