package daemon

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/connex/connex/advertise"
)

func TestDialAddr(t *testing.T) {
	for in, want := range map[string]string{
		"http://127.0.0.1:8100": "127.0.0.1:8100",
		"http://engine.local":   "engine.local:80",
		"https://[::1]/x":       "[::1]:443",
		"::not a url":           "",
	} {
		if got := dialAddr(in); got != want {
			t.Errorf("dialAddr(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDialOutcome(t *testing.T) {
	for err, want := range map[error]advertise.Dial{
		nil: advertise.Connected,
		fmt.Errorf("dial tcp 127.0.0.1:1: connect: %w", syscall.ECONNREFUSED): advertise.Refused,
		errors.New("dial tcp 10.0.0.1:80: i/o timeout"):                       advertise.Failed,
	} {
		if got := dialOutcome(err); got != want {
			t.Errorf("dialOutcome(%v) = %v, want %v", err, got, want)
		}
	}
}
