//go:build !ucx || !cgo

package ucx

import (
	"context"

	"github.com/connex/connex/transport"
)

// Available reports whether libucp can be used; without UCX it is false.
func Available() bool { return false }

// Open fails with an error wrapping transport.ErrUnavailable: this binary was
// built without UCX.
func Open(opts transport.Options) (*Backend, error) { return nil, errNoUCX }

// OpenConfig fails like Open.
func OpenConfig(opts transport.Options, cfg Config) (*Backend, error) { return nil, errNoUCX }

// AbandonedWorkers is 0: without UCX no worker is left undestroyed.
func AbandonedWorkers() int64 { return 0 }

// Backend is the UCX backend; without UCX none can be opened.
type Backend struct{}

var _ transport.Backend = (*Backend)(nil)

// Caps claims nothing: without UCX no backend exists to do anything.
func (*Backend) Caps() transport.Caps { return transport.Caps{} }

// Name is "ucx", so errors and metrics name the backend the binary lacks.
func (*Backend) Name() string { return "ucx" }

// Address is empty: there is nothing to connect to.
func (*Backend) Address() []byte { return nil }

// Register fails with an error wrapping transport.ErrUnavailable.
func (*Backend) Register([]byte) (transport.Registration, error) { return nil, errNoUCX }

// Alloc fails with an error wrapping transport.ErrUnavailable.
func (*Backend) Alloc(int) (*Registration, error) { return nil, errNoUCX }

// Connect fails with an error wrapping transport.ErrUnavailable.
func (*Backend) Connect(context.Context, []byte) (transport.Endpoint, error) { return nil, errNoUCX }

// Close does nothing.
func (*Backend) Close() error { return nil }

// Registration is memory registered with UCX; without UCX there is none.
type Registration struct{}

var _ transport.Registration = (*Registration)(nil)

// RemoteKey is empty: no Registration exists without UCX.
func (*Registration) RemoteKey() []byte { return nil }

// RemoteAddr is 0.
func (*Registration) RemoteAddr() uint64 { return 0 }

// Len is 0.
func (*Registration) Len() int { return 0 }

// Bytes is nil.
func (*Registration) Bytes() []byte { return nil }

// Deregister does nothing.
func (*Registration) Deregister() error { return nil }
