//go:build !linux

package router

import "net"

// stillOpen reports whether an idle connection can carry a request; where
// no non-blocking peek is at hand it is assumed so, and a request that
// meets the engine's close is sent once more on a new connection
// (retryFresh).
func stillOpen(net.Conn) bool { return true }
