package daemon

import (
	"context"
	"net"
	"net/netip"
	"time"

	"github.com/connex/connex/advertise"
)

// hostCheckTimeout bounds the name lookup of an engine's base_url host.
const hostCheckTimeout = 2 * time.Second

// ownHost is the policy for engines' base_url on this machine: loopback
// and the addresses of its interfaces (read at each check: interfaces come
// and go), names resolved by the system resolver, and the operator's
// engine_url_hosts.
func ownHost(allowed []string) advertise.HostPolicy {
	return advertise.HostPolicy{
		Allowed: allowed,
		Local: func(a netip.Addr) bool {
			if a.IsLoopback() {
				return true
			}
			addrs, err := net.InterfaceAddrs()
			if err != nil {
				return false
			}
			for _, ia := range addrs {
				if p, err := netip.ParsePrefix(ia.String()); err == nil && p.Addr().Unmap() == a {
					return true
				}
			}
			return false
		},
		Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		},
	}
}
